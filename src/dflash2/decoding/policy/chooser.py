"""The speculation policy's choice, as pure functions of (tables, costs, settings, offer): nothing here
writes (`learner.SpeculationPolicy` keeps the tables and costs, and learns).

Contract: `choose(...)` -> `Choice`: the room k and per row the source and tokens that maximise the
expected committed tokens per second, sum_r max_s E_{r,s}(min(k, T_{r,s})) / (t_draft + t_verify(b,
k + 1) + t_host), trees priced by their nodes (a fixed batch, `Offer.remaining`: the plain decoding
time saved per second). A probe takes acceptances and costs at their optimistic bounds; a draft
block that does not pay is verified without the draft's tokens; lookup alone is chosen at its mean,
and what only its optimistic bound would verify is probed as the exploration `budget` allows.
`worth_drafting(...)`: whether the draft pass, at its usual yield, would beat what the cycle has
without it: lookup alone, or in a batch a plain step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dflash2.decoding.policy.costs import CostModel
from dflash2.decoding.policy.cycle import LATTICE, Backoff, Choice, CycleRecord, Offer
from dflash2.decoding.policy.expectation import (AcceptanceModel, expectations_by_length, saved_seconds, step_curve,
                                                 tree_options)

SPECULATE_MODES = ("auto", "always", "never")
Tables = dict[str, AcceptanceModel]           # source ("draft", "lookup", LATTICE) -> its acceptance calibration
Expectations = dict[str, list[list[float]]]   # source -> per row [E(0), ..., E(T)]


@dataclass(frozen=True)
class Settings:
    """Back-offs last `min_backoff` to `max_backoff` cycles; exploration may lose `budget` of plain
    decoding's time, split between `sources`; a probe's bound adds `optimism` standard deviations."""
    mode: str = "auto"
    min_backoff: int = 8
    max_backoff: int = 512
    budget: float = 0.02
    optimism: float = 1.0
    sources: int = 1


class Pricing:
    """The cost model read at batch b (the draft pass averaged with `draft_seconds`, this cycle's; None:
    the model's figure) for a fixed batch's `remaining` tokens a row (None: a batch that refills)."""

    def __init__(self, costs: CostModel, b: int, draft_seconds: float | None = None,
                 remaining: list[int] | None = None):
        self.costs, self.b, self.remaining = costs, b, remaining
        self.draft_s = costs.draft(b) if draft_seconds is None else costs.draft_after(b, draft_seconds)
        self.steps = None if remaining is None else step_curve(b, self.plain_step)   # a plain step of 1..b rows

    def plain_step(self, b: int | None = None) -> float:
        b = self.b if b is None else b
        return self.costs.verify(b, 1) + self.costs.host(b, False)

    def plain_rate(self) -> float:
        return self.b / max(self.plain_step(), 1e-9)

    def cycle(self, k: int, drafted: bool = True, optimistic: bool = False) -> float:
        if k == 0 and not drafted:
            return self.plain_step()
        return ((self.draft_s if drafted else 0.0) + self.costs.verify(self.b, k + 1, optimistic)
                + self.costs.host(self.b, True))

    def rate(self, expected: list[float], seconds: float) -> float:
        """Tokens per second; a fixed batch (b > 1): the plain decoding time saved per second, in plain
        decoding's tokens per second."""
        seconds = max(seconds, 1e-9)
        if self.remaining is None or self.b == 1:
            return sum(expected) / seconds
        return saved_seconds(self.remaining, expected, self.steps) / seconds * self.b / max(self.steps[-1], 1e-9)

    def lost(self, seconds: float, tokens: float) -> float:
        return seconds - tokens / self.b * self.plain_step()

    def realised_loss(self, record: CycleRecord) -> float:
        """What a cycle lost against the plain decoding it saved."""
        committed = [accepted + 1 for accepted in record.accepted]
        if self.remaining is None:
            return self.lost(record.seconds, sum(committed))
        return record.seconds - saved_seconds(self.remaining, committed, self.steps)

    def wait_for(self, lost: float, settings: Settings) -> int:
        """Plain steps enough that `lost` is at most the budget's share of their time."""
        share = settings.budget / settings.sources
        return math.ceil(max(lost, 0.0) / max(share * self.plain_step(), 1e-12))


def unmeasured(costs: CostModel, settings: Settings, b: int) -> bool:
    """`auto` has not timed a plain step of b rows in this run: the cycle is one (free against plain
    decoding), not a choice that an unchecked figure decides."""
    return settings.mode == "auto" and (b, 1) not in costs.observed_s


def _probabilities(tables: Tables, offer: Offer, optimism: float) -> dict[str, list[list[float]]]:
    return {name: [tables[name].probabilities(c, g, optimism) for c, g in zip(confidence, offer.greedy)]
            for name, confidence in offer.sources()}


def expectations(tables: Tables, offer: Offer, optimism: float = 0.0) -> Expectations:
    return {name: [expectations_by_length(p) for p in rows]
            for name, rows in _probabilities(tables, offer, optimism).items()}


def _without_draft(rows: Expectations) -> Expectations:
    return {name: e for name, e in rows.items() if name != "draft"}


def trees(tables: Tables, offer: Offer, optimism: float = 0.0) -> list[list[tuple]] | None:
    """Per row and width the best tree, (expected tokens, nodes, draft length, second length, second
    source): the draft's path with lookup's, or with the lattice's second path (the draft's own tokens
    before the fork); None when no row may verify one."""
    if offer.draft is None or (offer.shared is None and offer.forks is None):
        return None
    p, out = _probabilities(tables, offer, optimism), []
    for r, draft in enumerate(p["draft"]):
        options = []
        if offer.shared is not None and offer.lookup is not None and offer.shared[r] is not None:
            options.append((tree_options(draft, p["lookup"][r], offer.shared[r]), "lookup"))
        if offer.forks is not None and offer.forks[r] is not None:
            fork = offer.forks[r]
            second = draft[:fork] + tables[LATTICE].probabilities(offer.lattice[r][fork:], True, optimism)
            options.append((tree_options(draft, second, fork), LATTICE))
        widest = max((len(o) for o, _ in options), default=0)
        out.append([max([(*o[min(w, len(o) - 1)], name) for o, name in options if o], key=lambda t: t[0])
                    for w in range(widest)])
    return out if any(out) else None


def _row_best(rows: Expectations, tree: list[tuple] | None, r: int, k: int, drafts: int, every: bool) -> tuple:
    """Row r's best at room k: (expected tokens, source, tokens verified, tree branches, second source)."""
    top = (-1.0 if every else 1.0, "", 0, (0, 0), "")
    for name, e in rows.items():
        n = min(k, drafts, len(e[r]) - 1)
        if e[r][n] > top[0] and n > 0:
            top = (e[r][n], name, n, (0, 0), "")
    if tree:
        expected, nodes, n_draft, n_second, second = tree[min(k, len(tree) - 1)]
        if expected > top[0] and nodes:
            top = (expected, "tree", nodes, (n_draft, n_second), second)
    return top


def best(pricing: Pricing, rows: Expectations, drafts: int, drafted: bool, every: bool = False,
         trees: list[list[tuple]] | None = None, optimistic: bool = False) -> Choice:
    """The k (up to `drafts` or the widest tree) of the highest rate, each row at its best option;
    `every`: the largest k, every row verifying all its best option offers."""
    top, room = None, max([drafts] + [len(t) - 1 for t in trees or []])
    for k in ([room] if every else range(room + 1)):
        per_row = [_row_best(rows, trees[r] if trees else None, r, k, drafts, every) for r in range(pricing.b)]
        expected = [max(option[0], 1.0) for option in per_row]
        sources, lengths, branches, second = (tuple(option[i] for option in per_row) for i in range(1, 5))
        width = max(lengths, default=0)
        rate = pricing.rate(expected, pricing.cycle(width, drafted, optimistic))
        if top is None or rate > top.rate:
            tree = "tree" in sources
            top = Choice(width, sum(expected), rate, sources, lengths, branches if tree else (), second if tree else ())
    return top


def choose(tables: Tables, costs: CostModel, settings: Settings, b: int, block: int, probe: bool,
           lookup_probes: Backoff, offer: Offer, draft_seconds: float | None = None) -> Choice:
    """`draft_seconds`: this cycle's draft pass (None: the model's figure)."""
    drafts, drafted = block - 1, offer.draft is not None
    pricing = Pricing(costs, b, draft_seconds, offer.remaining)
    if settings.mode == "always":
        return best(pricing, expectations(tables, offer), drafts, drafted, every=True, trees=trees(tables, offer))
    if unmeasured(costs, settings, b):
        return best(Pricing(costs, b, draft_seconds), {}, 0, drafted)   # a plain step, rated in tokens per second
    mean = expectations(tables, offer)
    if not drafted:     # lookup, which costs no pass, at its mean, or a lookup probe now and then
        choice = best(pricing, mean, drafts, False)
        if settings.mode != "auto" or offer.lookup is None:
            return choice
        if lookup_probes.waiting:
            return replace(choice, lookup_probes=lookup_probes.tick())
        bound = best(pricing, expectations(tables, offer, settings.optimism), drafts, False, optimistic=True)
        if bound.k <= choice.k:
            return choice
        tokens = sum(max(mean[source][r][n], 1.0) if source else 1.0       # the probe's tokens, at the mean
                     for r, (source, n) in enumerate(zip(bound.sources, bound.lengths)))
        lost = pricing.lost(pricing.cycle(bound.k, False), tokens)
        return replace(bound, lookup_probes=lookup_probes.wait(pricing.wait_for(lost, settings)))
    optimism = settings.optimism if probe else 0.0
    rows = expectations(tables, offer, optimism) if probe else mean
    choice = best(pricing, rows, drafts, True, trees=trees(tables, offer, optimism), optimistic=probe)
    without = best(pricing, _without_draft(rows), drafts, False, optimistic=probe)
    # what the draft cycle is measured against: the best choice without it, at the posterior mean
    at_mean = best(pricing, _without_draft(mean), drafts, False) if probe else without
    seconds = pricing.cycle(at_mean.k, drafted=False)
    baseline = seconds - at_mean.rate * seconds / pricing.plain_rate()
    per_row = sum(row[min(choice.k, len(row) - 1)] for row in rows["draft"]) / max(len(rows["draft"]), 1)
    draft_yield = None if probe else (choice.k, per_row)     # what the draft usually yields, for `worth_drafting`
    if choice.k == 0 or (probe and not choice.rate >= without.rate):
        choice = without                                      # the draft's pass is what the cycle loses
    return replace(choice, baseline=baseline, draft_yield=draft_yield)


def worth_drafting(tables: Tables, costs: CostModel, b: int, block: int, offer: Offer,
                   outlook: tuple[float, float] | None, skips: Backoff) -> tuple[bool, Backoff | None]:
    """(run the draft pass, the skipped-draft back-off after this cycle or None: unchanged): whether the
    draft, at its usual yield, beats what the cycle has without it: lookup's proposals, or in a batch a
    plain step (its rows share a pass, and a draft cycle that only ties with a plain step loses once
    rows finish: BENCHMARKS.md §2.3); the draft's first probe waits for a row lookup leaves uncovered."""
    if offer.lookup is None and b == 1:
        return True, None
    pricing = Pricing(costs, b, remaining=offer.remaining)
    lookup = expectations(tables, offer)                      # {} where lookup offers nothing
    alone = best(pricing, lookup, block - 1, drafted=False)
    if outlook is None:
        return offer.lookup is None or not all(alone.sources), None
    k, per_row = round(outlook[0]), outlook[1]
    offered = lookup.get("lookup", [[1.0]] * b)                 # a row offered nothing commits its one token
    mixed = [max(per_row, row[min(k, len(row) - 1)]) for row in offered]
    if pricing.rate(mixed, pricing.cycle(k, True)) > alone.rate:
        return True, skips.cancel()
    skips = (skips if skips.waiting else skips.wait()).tick()   # the outlook ages: a pass now and then renews it
    return not skips.waiting, skips
