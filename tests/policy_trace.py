"""A deterministic trace of the speculation policy's choices, to show that a change to the policy's
code keeps its behaviour: every cycle's plan, whether the draft ran, the choice (per row its source
and length, a tree's branches) and the fallback under way, in a synthetic world whose costs,
offers and acceptances come from seeded random numbers (the same world whatever the policy's code,
as long as it makes the same choices).

`policy_trace()` -> one list of cycle tuples per scenario (`SCENARIOS`). The recorded trace is
tests/fixtures/policy_trace.json.gz (the policy as a pure chooser and one learner, recorded again
when hybrid's outlook of the draft became a slow average: the hybrid scenarios changed, no other;
then when the draft alone in a batch came to skip its pass where a plain step pays more:
draft-b2-weak-sampled and draft-b4-sampled changed, no other; then when a cost figure's cold first
time came to give way to its second: every scenario's figures and so its rates changed, and the
scenarios' simulated tokens per second over 12 other seeds each moved by -2.3 % to +0.9 %, mean -0.4 %,
in this world that has no cold passes);
test_policy_trace.py compares. Re-record it only for a deliberate change of behaviour, measured. `cycle_of(record, plan_draft,
fallback_left)` is the tuple one cycle leaves (also used for traces of whole decodes,
scripts/decode_trace.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from dflash2.decoding.policy.costs import CostModel
from dflash2.decoding.policy.cycle import LATTICE, CycleRecord, Offer
from dflash2.decoding.policy import SpeculationPolicy
from dflash2.decoding.policy.chooser import unmeasured

BLOCK = 8


@dataclass(frozen=True)
class Scenario:
    name: str
    mode: str = "auto"
    proposer: str = "draft"          # draft | lookup | hybrid
    b: int = 1
    cycles: int = 160
    sampled: float = 0.0             # share of sampled rows
    trees: bool = False              # draft and lookup share prefixes (greedy rows)
    lattice: bool = False            # the draft's second path
    fixed: int = 0                   # a fixed batch's room a row (0: an open batch)
    calibration: float = 0.0         # a stored calibration at this factor of the true figures (0: none)
    per_token: float = 0.0008        # seconds a verified token a row adds
    phase: int = 40                  # cycles between the draft's good and bad stretches
    bad_first: bool = False          # the draft's first stretch is a bad one
    draft_cost: float = 1.0          # the draft pass's time, as a factor of the usual
    seed: int = 0


SCENARIOS = (
    Scenario("draft-b1"),
    Scenario("draft-b1-calibrated-dear", calibration=6.0),
    Scenario("draft-b1-weak", bad_first=True, draft_cost=3.0, phase=150, cycles=600, seed=13),
    Scenario("draft-b2-weak-sampled", b=2, sampled=0.5, bad_first=True, draft_cost=2.0, phase=120, cycles=400,
             seed=14),
    Scenario("draft-b4-sampled", b=4, sampled=0.5, seed=1),
    Scenario("draft-b8-fixed", b=8, fixed=90, seed=2),
    Scenario("draft-b1-lattice", lattice=True, seed=3),
    Scenario("lookup-b1", proposer="lookup", seed=4),
    Scenario("lookup-b8-dear", proposer="lookup", b=8, per_token=0.004, calibration=0.5, seed=5),
    Scenario("lookup-b3-fixed", proposer="lookup", b=3, fixed=50, seed=6),
    Scenario("hybrid-b1", proposer="hybrid", seed=7, cycles=240),
    Scenario("hybrid-b1-weak", proposer="hybrid", bad_first=True, draft_cost=3.0, phase=150, cycles=600, seed=15),
    Scenario("hybrid-b4-trees", proposer="hybrid", b=4, trees=True, seed=8, cycles=240),
    Scenario("hybrid-b4-trees-lattice-sampled", proposer="hybrid", b=4, trees=True, lattice=True, sampled=0.25,
             seed=9),
    Scenario("hybrid-b8-fixed-calibrated", proposer="hybrid", b=8, fixed=70, calibration=2.0, seed=10,
             cycles=240),
    Scenario("always-hybrid-b2-trees", mode="always", proposer="hybrid", b=2, trees=True, seed=11, cycles=60),
    Scenario("always-draft-b2", mode="always", b=2, seed=12, cycles=40),
    Scenario("never-b2", mode="never", proposer="hybrid", b=2, cycles=10),
)


class World:
    """The machine and the text of one scenario: true costs, offers and acceptances, all seeded."""

    def __init__(self, s: Scenario):
        self.s, self.rng = s, random.Random(s.seed)
        self.greedy = [self.rng.random() >= s.sampled for _ in range(s.b)]
        self.cycle = 0

    def verify(self, b: int, q: int) -> float:
        return (0.020 + 0.002 * b + self.s.per_token * b * q) * self.rng.uniform(0.9, 1.1)

    def draft_seconds(self, b: int) -> float:
        return self.s.draft_cost * (0.006 + 0.0004 * b) * self.rng.uniform(0.9, 1.1)

    def calibration(self) -> dict[tuple[int, int], float]:
        f = self.s.calibration
        return {(1, q): f * (0.022 + self.s.per_token * q) for q in (1, BLOCK, 4 * BLOCK, 16 * BLOCK)}

    def draft_quality(self) -> float:
        """The draft's true acceptance where its confidence is 1: good and bad stretches."""
        return 0.9 if (self.cycle // self.s.phase + self.s.bad_first) % 2 == 0 else 0.15

    def lookup_offer(self) -> list[list[float]]:
        out = []
        for _ in range(self.s.b):
            n = self.rng.choice([0, 0, 2, 5, 7, 7])
            out.append([round(self.rng.uniform(0.2, 0.95), 3) for _ in range(n)])
        return out

    def draft_offer(self) -> list[list[float]]:
        return [[round(self.rng.uniform(0.3, 0.99), 3) for _ in range(BLOCK - 1)] for _ in range(self.s.b)]

    def accept_run(self, p: list[float]) -> int:
        n = 0
        while n < len(p) and self.rng.random() < p[n]:
            n += 1
        return n

    def true_p(self, source: str, confidence: list[float]) -> list[float]:
        if source == "lookup":
            return [min(0.98, c * (1.0 if (self.cycle // 30) % 2 == 0 else 0.4)) for c in confidence]
        return [min(0.98, c * self.draft_quality()) for c in confidence]


class MemoryStore:
    """The engine's stored calibration (`files.calibration.StoredCalibration`), kept nowhere: the policy
    still adopts what it observed in place of a calibration that proves stale."""

    def write(self, table) -> None:
        pass


def _g(x: float) -> float:
    return float(f"{x:.10g}")


def cycle_of(record: CycleRecord, allowed: bool, fallback_left: int) -> list:
    """`allowed`: the plan allowed the draft pass (`auto`: neither a fallback nor an untimed batch size;
    whether it ran, after `worth_drafting`, is `record.drafted`)."""
    c = record.choice
    return [int(allowed), int(record.plan.probe), int(record.drafted), c.k, list(c.sources), list(c.lengths),
            [list(x) for x in c.branches], [c.second_source(r) if s == "tree" else "" for r, s in enumerate(c.sources)],
            _g(c.baseline), _g(c.rate), list(record.accepted), fallback_left]


def run(s: Scenario) -> list[list]:
    world = World(s)
    costs = CostModel()
    if s.calibration:
        costs.load_calibration(world.calibration())
    policy = SpeculationPolicy(s.mode if s.proposer else "never", costs, sources=2 if s.proposer == "hybrid" else 1)
    costs.store = MemoryStore()
    speculating = s.mode != "never"         # the engine makes no proposer then
    has_draft = speculating and s.proposer in ("draft", "hybrid")
    has_lookup = speculating and s.proposer in ("lookup", "hybrid")
    remaining = [s.fixed] * s.b if s.fixed else None
    trace = []
    for cycle in range(s.cycles):
        world.cycle, b = cycle, s.b
        lookups = world.lookup_offer() if has_lookup else None
        offer = Offer.of(world.greedy, lookup=lookups, remaining=remaining) if has_lookup else \
            Offer(world.greedy, remaining=remaining)
        plan = policy.prepare(b, offer, BLOCK, can_draft=has_draft)
        allowed = {"always": True, "never": False}.get(s.mode, not plan.fallback and not unmeasured(costs, policy.settings, b))
        drafted, draft_s, shared, forks = False, 0.0, None, None
        if plan.draft:
            drafted, draft_s = True, world.draft_seconds(b)
            confidence = world.draft_offer()
            if s.trees and lookups is not None:
                shared = [world.rng.choice([0, 0, 1, 2, 3]) if row else None for row in lookups]
                shared = [min(x, len(row) - 1) if x is not None else None for x, row in zip(shared, lookups)]
            lattice = None
            if s.lattice:
                forks = [world.rng.choice([None, 1, 2, 4]) for _ in range(b)]
                lattice = [[round(world.rng.uniform(0.2, 0.9), 3) for _ in range(BLOCK - 1)] for _ in range(b)]
            offer = Offer.of(offer.greedy, confidence, offer.lookup, shared, offer.remaining, lattice, forks)
        choice = plan.choose(offer, draft_s)
        verified, accepted, branch_accepted = [], [], {}
        for r, (source, n) in enumerate(zip(choice.sources, choice.lengths)):
            verified.append(n)
            if not source:
                accepted.append(0)
            elif source == "tree":
                n_draft, n_second = choice.branches[r]
                second_source = choice.second_source(r)
                split = offer.forks[r] if second_source == LATTICE else offer.shared[r]
                p_draft = world.true_p("draft", offer.draft[r])
                p_second = (p_draft[:split] + world.true_p("draft", offer.lattice[r][split:])
                            if second_source == LATTICE else world.true_p("lookup", offer.lookup[r]))
                common = world.accept_run(p_draft[:min(split, n_draft, n_second)])
                a_draft = a_second = common
                if common == min(split, n_draft, n_second) and common == split:
                    pick = world.rng.random()
                    if n_draft > split and pick < p_draft[split] / 2:
                        a_draft = split + 1 + world.accept_run(p_draft[split + 1:n_draft])
                    elif n_second > split and pick > 1 - p_second[split] / 2:
                        a_second = split + 1 + world.accept_run(p_second[split + 1:n_second])
                branch_accepted[r] = (a_draft, a_second)
                accepted.append(max(a_draft, a_second))
            else:
                confidence = offer.draft[r] if source == "draft" else offer.lookup[r]
                accepted.append(world.accept_run(world.true_p(source, confidence)[:n]))
        width = 1 + max(verified) if choice.has_tree else choice.k + 1
        verify_s = world.verify(b, width)
        record = CycleRecord(b, offer, plan, choice, drafted, verified, accepted, width, draft_s, verify_s,
                             0.0004 * b, branch_accepted=branch_accepted)
        policy.observe(record)
        trace.append(cycle_of(record, allowed, policy.fallback.left))
        if remaining is not None:
            remaining = [x - a - 1 for x, a in zip(remaining, accepted)]
            if min(remaining) <= 0:
                remaining = [s.fixed] * s.b
    return trace


def policy_trace() -> dict[str, list[list]]:
    return {s.name: run(s) for s in SCENARIOS}
