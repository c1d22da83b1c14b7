"""Token trees: several proposed continuations of a row verified in one target pass.

Contract:
- `pack_tree(branches, width, device)`: per row a list of branches (token lists, the first one the
  row's main path; rows may have one branch or none) -> `TokenTree`: the branches merged into a
  trie below the anchor (shared prefixes become one node) and packed into one sequence of `width`
  tokens a row: node 0 is the anchor, the first branch takes nodes 1..n_0 in order (so a row with
  one branch is the usual linear block), each further branch adds the nodes where it leaves the
  trie. Per node: its depth below the anchor (its position is the anchor's + depth) and which
  nodes it may attend to, `visible` [b, W, W] (its ancestors and itself; with the committed
  context that makes the tree attention mask). Nodes past a row's tree are padding: depth 0,
  seeing only themselves, never kept. `paths` [b, n_branches, L + 1] lists each branch's nodes
  from the anchor (padded by repeating its last node), `lengths` [b, n_branches] their lengths
  (0 for a missing branch).
- `tree_greedy_accept(tree, target_argmax)` -> `TreeAcceptance`: per branch the longest prefix whose
  tokens equal the target's argmax at their parent node; the winning branch is the one that
  accepted most (the lowest index on a tie, so the main path wins ties); the next token is the
  target's argmax at the last accepted node. So the committed tokens are exactly what greedy decoding
  of the target would give: every accepted token is the argmax after its accepted ancestors.
- `kept_nodes(tree, branch, accepted)` -> [b, W] bool: the nodes whose keys stay in the target's
  cache (the anchor and the winning branch's accepted nodes); `path_nodes(tree, branch)` -> [b, L + 1]
  the winning branch's node indices in order (to gather its features).
Pure functions of tensors: no model runs here. Trees serve greedy rows (a deterministic draft per
branch); a sampled row verifies one branch (`acceptance.sample_accept`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenTree:
    ids: torch.Tensor        # [b, W] node tokens, node 0 the anchor
    depth: torch.Tensor      # [b, W] depth below the anchor
    visible: torch.Tensor    # [b, W, W] bool: node i attends to node j
    paths: torch.Tensor      # [b, n, L + 1] node indices along each branch, from the anchor
    lengths: torch.Tensor    # [b, n] tokens of each branch

    @property
    def width(self) -> int:
        return self.ids.shape[1]


@dataclass
class TreeAcceptance:
    accepted: torch.Tensor        # [b] tokens accepted on the winning branch
    branch: torch.Tensor          # [b] the winning branch
    bonus: torch.Tensor           # [b] the target's token after them
    per_branch: torch.Tensor      # [b, n] tokens each branch had accepted


def tree_nodes(branches: list[list[int]]) -> int:
    """Nodes below the anchor that `branches` need once shared prefixes are merged."""
    seen: set[tuple[int, ...]] = set()
    for branch in branches:
        seen.update(tuple(branch[:i]) for i in range(1, len(branch) + 1))
    return len(seen)


def pack_tree(anchors: list[int], branches: list[list[list[int]]], width: int, device) -> TokenTree:
    """See the module docstring; `width` >= 1 + the most nodes any row needs."""
    b = len(anchors)
    n = max(1, max((len(row) for row in branches), default=1))
    longest = max((len(t) for row in branches for t in row), default=0)
    ids = torch.zeros(b, width, dtype=torch.long)
    depth = torch.zeros(b, width, dtype=torch.long)
    parent = torch.full((b, width), -1, dtype=torch.long)
    paths = torch.zeros(b, n, longest + 1, dtype=torch.long)
    lengths = torch.zeros(b, n, dtype=torch.long)
    for r, row in enumerate(branches):
        ids[r, 0] = anchors[r]
        children: dict[tuple[int, int], int] = {}      # (parent node, token) -> node
        used = 1
        for i, tokens in enumerate(row):
            node = 0
            for d, token in enumerate(tokens, start=1):
                child = children.get((node, token))
                if child is None:
                    child, used = used, used + 1
                    children[(node, token)] = child
                    ids[r, child], depth[r, child], parent[r, child] = token, d, node
                node = child
                paths[r, i, d] = node
            paths[r, i, len(tokens) + 1:] = node
            lengths[r, i] = len(tokens)
        assert used <= width, f"a tree of {used} nodes does not fit in width {width}"
    visible = torch.eye(width, dtype=torch.bool).expand(b, width, width).clone()
    ancestor = parent.clone()
    while bool((ancestor >= 0).any()):                 # walk up: each node sees all its ancestors
        rows, nodes = (ancestor >= 0).nonzero(as_tuple=True)
        visible[rows, nodes, ancestor[rows, nodes]] = True
        ancestor = torch.where(ancestor >= 0, parent.gather(1, ancestor.clamp(min=0)), ancestor)
    return TokenTree(ids.to(device), depth.to(device), visible.to(device), paths.to(device), lengths.to(device))


def tree_greedy_accept(tree: TokenTree, target_argmax: torch.Tensor) -> TreeAcceptance:
    """target_argmax [b, W] (the target's argmax after each node) -> the greedy outcome per row."""
    b, n, _ = tree.paths.shape
    rows = torch.arange(b, device=tree.ids.device)
    flat = tree.paths.reshape(b, -1)                                                   # [b, n * (L + 1)]
    tokens = tree.ids.gather(1, flat).view_as(tree.paths)[:, :, 1:]                    # [b, n, L]
    predicted = target_argmax.gather(1, flat).view_as(tree.paths)[:, :, :-1]           # [b, n, L] at the parents
    matched = (tokens == predicted).long().cumprod(dim=-1).sum(dim=-1)                 # [b, n]
    per_branch = torch.minimum(matched, tree.lengths)
    branch = per_branch.argmax(dim=-1)                                                 # first maximum
    accepted = per_branch[rows, branch]
    last = tree.paths[rows, branch, accepted]
    return TreeAcceptance(accepted, branch, target_argmax[rows, last], per_branch)


def path_nodes(tree: TokenTree, branch: torch.Tensor) -> torch.Tensor:
    """[b] branch -> [b, L + 1] its node indices from the anchor."""
    return tree.paths[torch.arange(tree.paths.shape[0], device=branch.device), branch]


def kept_nodes(tree: TokenTree, branch: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """[b] branch, [b] accepted -> [b, W] bool: the anchor and the branch's first `accepted` nodes."""
    nodes = path_nodes(tree, branch)                                                   # [b, L + 1]
    on_path = torch.arange(nodes.shape[1], device=nodes.device)[None, :] <= accepted[:, None]
    kept = torch.zeros_like(tree.ids)
    return kept.scatter_add(1, nodes, on_path.long()) > 0
