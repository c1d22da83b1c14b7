"""What one decoding cycle offers, chooses and did: the typed records the engine, the proposers and
the speculation policy (`decoding.policy`) pass between them.

Contract:
- `CyclePlan(draft, probe)`: whether a cycle runs the draft pass, and whether it is a probe.
- `Offer`: per row, each source's confidence in its tokens (the draft's, lookup's; the draft's
  second path's), where draft and lookup share a prefix (a tree), and a fixed batch's room.
  `Offer.of` hides a sampled row's draft confidence (a choice by a random draw biases the output).
- `Choice`: what one cycle verifies (room k, per row its source and length, a tree's branches).
- `CycleRecord`: what the cycle did (verified, accepted, the pass's width, its times).
Sources: `SOURCES` ("draft", "lookup") verify alone; `LATTICE` (the draft's second path) only as a
tree's second branch. Nothing here decides anything: `decoding.policy` does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

@dataclass(frozen=True)
class CyclePlan:
    draft: bool
    probe: bool = False


SOURCES = ("draft", "lookup")   # the sources a row may verify alone
LATTICE = "lattice"             # the draft's second path: only ever a tree's second branch
SAMPLED_DRAFT_CONFIDENCE = 0.5   # what the policy sees of a sampled row's draft tokens (see `Offer.of`)


@dataclass(frozen=True)
class Offer:
    """What the proposers offer one cycle, per row: each source's confidence in its tokens (None:
    the source did not run this cycle; an empty list: it has nothing for that row)."""
    greedy: list[bool]
    draft: list[list[float]] | None = None
    lookup: list[list[float]] | None = None
    shared: list[int | None] | None = None   # per row: tokens the draft and lookup proposals share
                                             # at their start, where both may be verified as a tree
    remaining: list[int] | None = None       # per row: tokens it may still commit, when the batch is
                                             # fixed (`decoding.policy.horizon`); None: a batch that refills
    lattice: list[list[float]] | None = None  # per row: the draft's second path's confidence per token
    forks: list[int | None] | None = None     # per row: where it leaves the draft's path (None: no tree)

    @classmethod
    def of(cls, greedy: list[bool], draft: list[list[float]] | None = None,
           lookup: list[list[float]] | None = None, shared: list[int | None] | None = None,
           remaining: list[int] | None = None, lattice: list[list[float]] | None = None,
           forks: list[int | None] | None = None) -> "Offer":
        """A sampled row's draft tokens were drawn at random: choosing by their confidence would
        make the choice depend on the draw, which biases the output (the acceptance rule is exact
        for a proposal chosen independently of it). Those rows offer a constant instead, so the
        policy learns their mean acceptance. Lookup tokens are not drawn: they are seen as they are.
        Trees are for greedy rows only (where draft and lookup agree depends on a sampled draw)."""
        if draft is not None:
            draft = [c if g else [SAMPLED_DRAFT_CONFIDENCE] * len(c) for c, g in zip(draft, greedy)]
        if shared is not None:
            shared = [s if g else None for s, g in zip(shared, greedy)]
        if forks is not None:
            forks = [f if g else None for f, g in zip(forks, greedy)]
        return cls(greedy, draft, lookup, shared, remaining, lattice, forks)

    def sources(self) -> list[tuple[str, list[list[float]]]]:
        return [(name, c) for name, c in zip(SOURCES, (self.draft, self.lookup)) if c is not None]

    def without_draft(self) -> "Offer":
        return Offer(self.greedy, None, self.lookup, None, self.remaining)


@dataclass(frozen=True)
class Choice:
    """What one cycle verifies: room for k drafts a row (the pass runs k + 1 tokens a row), each
    row's source ("draft", "lookup", "tree" for a tree; "" for none) and number of tokens
    verified (<= k; a tree's nodes below the anchor), the expected tokens this commits summed over
    the rows, and the rate (tokens per second) that gives. `branches`: per row the lengths of its
    tree's draft branch and second branch ((0, 0) for rows without one; empty when no row has
    one), `seconds`: per row the second branch's source ("lookup" or `LATTICE`; "" without a tree).
    `baseline`: what the best choice without the draft was expected to lose against plain decoding
    (seconds; negative: to gain), which a draft cycle's realised gain is judged against."""
    k: int
    expected: float
    rate: float
    sources: tuple[str, ...] = ()
    lengths: tuple[int, ...] = ()
    branches: tuple[tuple[int, int], ...] = ()
    seconds: tuple[str, ...] = ()
    baseline: float = 0.0

    @property
    def has_tree(self) -> bool:
        return "tree" in self.sources

    def second_source(self, r: int) -> str:
        """Row r's tree's second branch: "lookup" or `LATTICE` (lookup when `seconds` is not given)."""
        return self.seconds[r] if self.seconds else "lookup"


@dataclass
class CycleRecord:
    """What one cycle did, as the policy learns from it: the offer and the choice, whether the draft
    pass ran (and was a probe), per row the drafts verified and accepted, the pass's width (tokens
    a row through the target) and the cycle's times (draft pass, target pass, the rest)."""
    b: int
    offer: Offer
    choice: Choice
    drafted: bool
    probe: bool
    verified: list[int]
    accepted: list[int]
    width: int
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    host_seconds: float = 0.0
    branch_accepted: dict[int, tuple[int, int]] = field(default_factory=dict)  # tree row -> (draft, lookup) accepted

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds + self.host_seconds
