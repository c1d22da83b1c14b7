"""The values a cycle passes between engine and policy, deciding nothing: what is offered (`Offer`),
planned (`CyclePlan`; its `choose` gives the `Choice`) and done (`CycleRecord`, all the policy
learns from), and `Backoff`, every wait the policy keeps."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

SOURCES = ("draft", "lookup")    # the sources a row may verify alone
LATTICE = "lattice"              # the draft's second path: only ever a tree's second branch
SAMPLED_DRAFT_CONFIDENCE = 0.5   # all the policy sees of a sampled row's draft tokens (`Offer.of`)


@dataclass(frozen=True)
class Backoff:
    """A wait of `left` cycles; the next lasts at least `length`, which doubles (up to `longest`) when
    a wait runs out and is back at `shortest` on `relax()`."""
    shortest: int
    longest: int
    length: int
    left: int = 0

    @classmethod
    def between(cls, shortest: int, longest: int) -> Backoff:
        return cls(shortest, longest, shortest)

    @property
    def waiting(self) -> bool:
        return self.left > 0

    def wait(self, needed: int = 0) -> Backoff:
        n = min(max(self.length, needed), self.longest)
        return replace(self, length=n, left=n)

    def tick(self) -> Backoff:
        left = self.left - 1
        return replace(self, left=left, length=self.length if left else min(2 * self.length, self.longest))

    def cancel(self) -> Backoff:
        return replace(self, left=0)

    def relax(self) -> Backoff:
        return replace(self, length=self.shortest)


@dataclass(frozen=True)
class Offer:
    """Per row, each source's confidence in its tokens (None: the source did not run this cycle; []
    for a row: nothing for it)."""
    greedy: list[bool]
    draft: list[list[float]] | None = None
    lookup: list[list[float]] | None = None
    shared: list[int | None] | None = None    # tokens the draft's and lookup's proposals share at their start
    remaining: list[int] | None = None        # tokens each row may still commit in a fixed batch (None: refills)
    lattice: list[list[float]] | None = None  # the draft's second path's confidence per token
    forks: list[int | None] | None = None     # where it leaves the draft's path (None: no tree)

    @classmethod
    def of(cls, greedy: list[bool], draft=None, lookup=None, shared=None, remaining=None, lattice=None,
           forks=None) -> Offer:
        """A sampled row offers a constant draft confidence and no tree: the acceptance rule is exact
        only for a proposal chosen independently of the draft's random draw."""
        def greedy_rows(values):
            return None if values is None else [v if g else None for v, g in zip(values, greedy)]
        if draft is not None:
            draft = [c if g else [SAMPLED_DRAFT_CONFIDENCE] * len(c) for c, g in zip(draft, greedy)]
        return cls(greedy, draft, lookup, greedy_rows(shared), remaining, lattice, greedy_rows(forks))

    def sources(self) -> list[tuple[str, list[list[float]]]]:
        return [(name, c) for name, c in zip(SOURCES, (self.draft, self.lookup)) if c is not None]


@dataclass(frozen=True)
class Choice:
    """Room for k tokens a row; per row the source ("draft", "lookup", "tree", "" for none) and tokens
    verified (a tree's nodes; `branches` its two lengths, `second_sources` its second branch's source).
    For the learner: `baseline` (what the best choice without the draft was expected to lose against
    plain decoding, seconds), `lookup_probes` (None: unchanged), `draft_yield` (an ordinary draft
    cycle's best k and expected tokens a row)."""
    k: int
    expected: float
    rate: float
    sources: tuple[str, ...] = ()
    lengths: tuple[int, ...] = ()
    branches: tuple[tuple[int, int], ...] = ()
    second_sources: tuple[str, ...] = ()
    baseline: float = 0.0
    lookup_probes: Backoff | None = None
    draft_yield: tuple[int, float] | None = None

    @classmethod
    def nothing(cls, b: int) -> Choice:
        """A plain step (nothing offered)."""
        return cls(0, float(b), 0.0, ("",) * b, (0,) * b)

    @property
    def has_tree(self) -> bool:
        return "tree" in self.sources

    def second_source(self, r: int) -> str:
        return self.second_sources[r] if self.second_sources else "lookup"


@dataclass(frozen=True)
class CyclePlan:
    """`draft`: run the draft pass; `probe`: choose optimistically; `fallback`: a fallback's plain step;
    `skips`: the skipped-draft back-off after this cycle (None: as it was); `chooser` makes the choice."""
    draft: bool
    probe: bool = False
    fallback: bool = False
    skips: Backoff | None = None
    chooser: Callable[[Offer, float | None], Choice] | None = None

    def choose(self, offer: Offer, draft_seconds: float | None = None) -> Choice:
        """The cycle's choice once the offer is complete (`draft_seconds`: its draft pass's time)."""
        if self.chooser is None or not offer.sources():
            return Choice.nothing(len(offer.greedy))
        return self.chooser(offer, draft_seconds)


@dataclass
class CycleRecord:
    """What one cycle did: per row tokens verified and accepted (a tree row's per branch too), the
    pass's width (tokens a row) and its times."""
    b: int
    offer: Offer
    plan: CyclePlan
    choice: Choice
    drafted: bool
    verified: list[int]
    accepted: list[int]
    width: int
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    host_seconds: float = 0.0
    branch_accepted: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds + self.host_seconds
