"""What one cycle's target pass verifies, row by row, and what each row commits from it.

Contract: `assemble(choice, anchors, room, proposal, lookups)` builds the cycle's `VerifyBlock` from
the policy's `Choice` and the proposals (a linear block, or a `tree.TokenTree` when a row verifies
two branches). `VerifyBlock(ids, q, limits, branches, sources, verified, tree)`: ids [b, W] (each row's
anchor first), q [b, W - 1, V] for sampled rows (None: every q one-hot, a point-mass draft), the
length of each row's linear path (its first branch, at nodes 1..limit), per row its branches'
tokens and their sources ("draft", "lookup"), the tokens verified (a tree's nodes) and the
`tree.TokenTree` (None: every row one linear path). `commit(r, accepted, branch, bonus)` -> the
row's `Commit`; `branch_accepted(per_branch)` -> tree row -> tokens each branch had accepted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash2.decoding.proposers.lookup import Lookup
from dflash2.decoding.policy.cycle import LATTICE, Choice
from dflash2.decoding.proposers.draft import Proposal
from dflash2.decoding.loop.stats import Commit
from dflash2.decoding.proposers.tree import TokenTree, pack_tree, tree_nodes


@dataclass
class VerifyBlock:
    """What one cycle's target pass verifies: ids [b, W] (the anchor first), q [b, W - 1, V] for
    sampled rows (None: every q one-hot), the linear path's length per row (limits [b]), per row its
    branches' tokens and their sources (the first branch at nodes 1..limit), the tokens verified
    (a tree's nodes) and the tree (None: every row one linear path)."""
    ids: torch.Tensor
    q: torch.Tensor | None
    limits: torch.Tensor
    branches: list[list[list[int]]]
    sources: list[tuple[str, ...]]
    verified: list[int]
    tree: TokenTree | None = None

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def commit(self, r: int, accepted: int, branch: int, bonus: int) -> Commit:
        """Row r's commit: the winning branch's first `accepted` tokens and the target's next token."""
        if not self.branches[r]:
            return Commit([bonus], 0, 0, "")
        tokens = self.branches[r][branch]
        extra = self.verified[r] - max(len(t) for t in self.branches[r]) if len(self.branches[r]) > 1 else None
        return Commit(tokens[:accepted] + [bonus], accepted, self.verified[r], self.sources[r][branch], extra)

    def branch_accepted(self, per_branch: torch.Tensor | None) -> dict[int, tuple[int, ...]]:
        """Tree row -> tokens each of its branches had accepted."""
        if per_branch is None:
            return {}
        counts = per_branch.tolist()
        return {r: tuple(counts[r][:len(row)]) for r, row in enumerate(self.branches) if len(row) > 1}


def assemble(choice: Choice, anchors: torch.Tensor, room: list[int], proposal: Proposal | None,
             lookups: list[Lookup] | None) -> VerifyBlock:
    """What each row verifies this cycle (`choice`, anchors [b]): its chosen source's first tokens,
    at most room[r] (the row's own block size - 1); a tree row the draft's path and its second
    branch (lookup's, or the lattice's second path, whose tokens are the draft's own)."""
    device, b = anchors.device, anchors.shape[0]
    draft_rows = proposal.tokens.tolist() if proposal is not None else [[] for _ in range(b)]
    second_rows = proposal.second.tokens.tolist() if proposal is not None and proposal.second is not None else None
    branches, sources = [], []
    for r, (source, n) in enumerate(zip(choice.sources, choice.lengths)):
        limit = room[r]
        if source == "tree":
            n_draft, n_second = choice.branches[r]
            lattice = choice.second_source(r) == LATTICE
            second = second_rows[r] if lattice else lookups[r].tokens
            branches.append([draft_rows[r][:min(n_draft, limit)], second[:min(n_second, limit)]])
            sources.append(("draft", "draft" if lattice else "lookup"))
        else:
            tokens = lookups[r].tokens if source == "lookup" else draft_rows[r]
            branches.append([tokens[:min(n, limit)]] if source else [])
            sources.append((source,))
    verified = [tree_nodes(row) for row in branches]
    limits = torch.tensor([len(row[0]) if row else 0 for row in branches], dtype=torch.long, device=device)
    if choice.has_tree:
        tree = pack_tree(anchors.tolist(), branches, 1 + max(verified), device)
        ids = tree.ids
    else:   # rows verifying fewer than k tokens are padded with the draft's (their limit stops acceptance)
        tree, k = None, choice.k
        drafts = proposal.tokens[:, :k].clone() if proposal is not None else anchors.new_zeros(b, k)
        for r, (source, n) in enumerate(zip(choice.sources, choice.lengths)):
            if source == "lookup":
                drafts[r, :n] = torch.tensor(lookups[r].tokens[:n], dtype=torch.long, device=device)
        ids = torch.cat([anchors[:, None], drafts], dim=1)                                 # [b, k + 1]
    q = None
    if proposal is not None and proposal.q is not None:   # one-hot q: a point-mass draft (lookup, padding)
        q = torch.zeros(b, ids.shape[1] - 1, proposal.q.shape[-1], device=device).scatter_(-1, ids[:, 1:, None], 1.0)
        for r, source in enumerate(choice.sources):
            if source == "draft":
                n = int(limits[r])
                q[r, :n] = proposal.q[r, :n]
    return VerifyBlock(ids, q, limits, branches, sources, verified, tree)
