"""What one cycle's target pass verifies, row by row, and what each row commits from it.

Contract: `VerifyBlock(ids, q, limits, branches, sources, verified, tree)`: ids [b, W] (each row's
anchor first), q [b, W - 1, V] for sampled rows (None: every q one-hot, a point-mass draft), the
length of each row's linear path (its first branch, at nodes 1..limit), per row its branches'
tokens and their sources ("draft", "lookup"), the tokens verified (a tree's nodes) and the
`tree.TokenTree` (None: every row one linear path). `commit(r, accepted, branch, bonus)` -> the
row's `Commit`; `branch_accepted(per_branch)` -> tree row -> tokens each branch had accepted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash2.decoding.stats import Commit
from dflash2.decoding.tree import TokenTree


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
