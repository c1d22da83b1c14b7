"""The speculation policy: `SpeculationPolicy` is the one object that learns, and only from cycle
records; its choice is `chooser`'s pure functions.

Contract: `SpeculationPolicy(mode, costs, ...)` (the rest: `chooser.Settings`): `never` decodes
plainly, `always` verifies the whole block every cycle, `auto` what pays for itself.
`prepare(b, offer, block, can_draft)` -> `CyclePlan`, reading only; `observe(record)`, the only
writer: tables, costs, back-offs, and in `auto` `GainEvidence` of each draft cycle's gain (the plain
decoding time it saved beyond `Choice.baseline`, less its own, in plain steps). The draft pass stops
only when even the evidence's optimistic bound is a loss, until what the draft cycles since the
last fallback lost (`stretch`) is `budget` of the fallback's time: a draft that never pays costs at
most `budget` of plain decoding's time. The first draft cycle, and the first after a fallback, probe.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import partial

from dflash2.decoding.policy.chooser import (SPECULATE_MODES, Pricing, Settings, Tables, choose, unmeasured,
                                             worth_drafting)
from dflash2.decoding.policy.costs import CostModel, averaged
from dflash2.decoding.policy.cycle import LATTICE, Backoff, CyclePlan, CycleRecord, Offer
from dflash2.decoding.policy.expectation import AcceptanceModel
from dflash2.files.calibration import StoredCalibration

DRAFT_SCALE_WEIGHT = 8.0   # the draft's confidence is a trained model's probability: its table-wide calibration
                           # moves only as evidence worth 8 reached tokens says (lookup's heuristic one: 2)
DECAY, PRIOR, CLIP = 0.99, 4.0, 2.0   # `GainEvidence`: weight per cycle, pseudo-cycles at gain 0, largest |gain|
OUTLOOK_CYCLES = 32       # the draft's usual yield averages about this many draft cycles (the first ones equally):
                          # one block's yield swings from 1 to 8 tokens, and a short average that dips on a few
                          # poor blocks would stop the pass for a whole back-off while lookup offers anything


@dataclass
class GainEvidence:
    """Draft cycles' gains in plain steps (+1.0: a step gained), clipped, weighted by `DECAY` per draft
    cycle and plain step, shrunk towards `PRIOR` cycles at gain 0 (spread 1): one or two cycles are
    weak evidence, three that lose most of a plain step (or eight that lose a quarter) strong."""
    weight: float = 0.0       # sum of the weights of the cycles seen
    total: float = 0.0        # weighted sum of their gains
    squares: float = 0.0      # weighted sum of their squared gains

    def age(self) -> None:
        self.weight, self.total, self.squares = self.weight * DECAY, self.total * DECAY, self.squares * DECAY

    def add(self, gain: float) -> None:
        self.age()
        gain = max(-CLIP, min(CLIP, gain))
        self.weight, self.total, self.squares = self.weight + 1.0, self.total + gain, self.squares + gain * gain

    def mean(self) -> float:
        return self.total / (self.weight + PRIOR)

    def upper(self, z: float) -> float:
        """The mean plus `z` standard errors."""
        n, mean = self.weight + PRIOR, self.mean()
        return mean + z * math.sqrt(max((self.squares + PRIOR) / n - mean * mean, 0.0) / n)   # the prior: spread 1


class SpeculationPolicy:
    def __init__(self, mode: str = "auto", costs: CostModel | None = None, **settings):
        if mode not in SPECULATE_MODES:
            raise ValueError(f"speculate mode must be one of {', '.join(SPECULATE_MODES)}, got {mode!r}")
        self.settings = Settings(mode, **settings)
        self.costs = costs or CostModel()
        self.tables: Tables = {"draft": AcceptanceModel(scale_weight=DRAFT_SCALE_WEIGHT), "lookup": AcceptanceModel(),
                               LATTICE: AcceptanceModel()}
        self.evidence = GainEvidence()
        self.stretch = 0.0               # seconds the draft cycles since the last fallback lost, on balance
        self.probing = True              # the next draft pass is a probe
        self.outlook: tuple[float, float] | None = None   # the draft's usual (k, expected tokens a row)
        self.outlook_cycles = 0          # draft cycles behind it
        backoff = Backoff.between(self.settings.min_backoff, self.settings.max_backoff)
        self.fallback = backoff          # plain steps without the draft pass
        self.lookup_probes = backoff     # lookup cycles until a lookup probe
        self.draft_skips = backoff       # skipped draft passes until one renews

    @property
    def mode(self) -> str:
        return self.settings.mode

    def fresh(self) -> SpeculationPolicy:
        """The same settings and cost model (its calibration store too), nothing learnt."""
        return SpeculationPolicy(costs=self.costs, **asdict(self.settings))

    def calibrate(self, target, block: int) -> bool:
        """The cost model's start-up figures, once: stored for this machine and target, else measured and
        stored (True: read or measured now; not a cycle's time)."""
        if self.mode != "auto" or self.costs.calibrated or block < 2:
            return False
        store = StoredCalibration.of(target, block)
        self.costs.load_calibration(store.read())
        if not self.costs.calibrated:
            self.costs.calibrate(target, block)
            store.write(self.costs.calibrated_s)
        self.costs.store = store
        return True

    def prepare(self, b: int, offer: Offer, block: int, can_draft: bool = True) -> CyclePlan:
        draft, probe, fallback, skips = can_draft and block > 1, False, False, None
        if self.mode != "auto":
            draft = draft and self.mode == "always"
        elif self.fallback.waiting:
            draft, fallback = False, True
        elif unmeasured(self.costs, self.settings, b):
            draft = False
        else:
            draft, skips = worth_drafting(self.tables, self.costs, b, block, offer, self.outlook,
                                          self.draft_skips) if draft else (False, None)
            probe = self.probing
        chooser = partial(choose, self.tables, self.costs, self.settings, b, block, probe, self.lookup_probes)
        return CyclePlan(draft, probe, fallback, skips, chooser)

    def observe(self, record: CycleRecord) -> None:
        b, plan, choice = record.b, record.plan, record.choice
        if plan.fallback:
            self.fallback = self.fallback.tick()
            self.evidence.age()
            self.probing = self.probing or not self.fallback.waiting
        if plan.skips is not None:
            self.draft_skips = plan.skips
        if choice.draft_yield is not None:   # the draft's usual yield: a slow moving average
            (k, per_row), old = choice.draft_yield, self.outlook or (None, None)
            self.outlook_cycles += 1
            weight = 1.0 / min(self.outlook_cycles, OUTLOOK_CYCLES)
            self.outlook = (averaged(old[0], float(k), weight), averaged(old[1], per_row, weight))
            if "draft" in choice.sources or choice.has_tree:   # the draft was chosen
                self.draft_skips = self.draft_skips.relax()
        if choice.lookup_probes is not None:
            self.lookup_probes = choice.lookup_probes
        if record.drafted:
            self.costs.observe_draft(b, record.draft_seconds)
        self.costs.observe_verify(b, record.width, record.verify_seconds)
        self.costs.observe_host(b, record.drafted or record.width > 1, record.host_seconds)
        self._calibrate_tables(record)
        if record.drafted and self.mode == "auto":
            self._weigh(record)
        if self.costs.store is not None and self.costs.stale():   # what this run measures replaces
            self.costs.store.write(self.costs.adopt_observed())    # a stored calibration it contradicts

    def _calibrate_tables(self, record: CycleRecord) -> None:
        offer, choice, offered = record.offer, record.choice, dict(record.offer.sources())
        for r, (source, verified, accepted) in enumerate(zip(choice.sources, record.verified, record.accepted)):
            if source == "tree":      # each branch calibrates its own source
                (n_draft, n_second), (draft_accepted, second_accepted) = choice.branches[r], record.branch_accepted[r]
                self.tables["draft"].observe(offer.draft[r], True, n_draft, draft_accepted)
                fork = offer.forks[r] if choice.second_source(r) == LATTICE else None
                if fork is None:
                    self.tables["lookup"].observe(offer.lookup[r], True, n_second, second_accepted)
                elif second_accepted >= fork:   # the lattice's own tokens, reached once the shared ones were accepted
                    self.tables[LATTICE].observe(offer.lattice[r][fork:], True, n_second - fork, second_accepted - fork)
            elif source and verified:
                self.tables[source].observe(offered[source][r], offer.greedy[r], verified, accepted)

    def _weigh(self, record: CycleRecord) -> None:
        pricing = Pricing(self.costs, record.b, remaining=record.offer.remaining)
        loss = pricing.realised_loss(record) - record.choice.baseline
        self.evidence.add(-loss / max(pricing.plain_step(), 1e-9))
        self.stretch = max(0.0, self.stretch + loss)
        self.probing = False
        if self.evidence.mean() > 0.0:
            self.fallback = self.fallback.relax()
        if not self.fallback.waiting and self.evidence.upper(self.settings.optimism) < 0.0:
            self.fallback = self.fallback.wait(pricing.wait_for(self.stretch, self.settings))
            self.stretch = 0.0
