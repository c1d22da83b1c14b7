"""The cost side of the loop: expected tokens, the acceptance calibration, the cost model and the
speculation policy's choices (pure Python: no model runs)."""
from __future__ import annotations

import math
import random

import pytest

from conftest import policy_choice
from dflash2.decoding.policy.costs import CostModel
from dflash2.decoding.policy.expectation import AcceptanceModel, expectations_by_length
from dflash2.decoding.policy.chooser import Pricing, worth_drafting
from dflash2.decoding.policy.cycle import Backoff, Choice, CyclePlan, CycleRecord, Offer
from dflash2.decoding.policy import SpeculationPolicy


def test_expected_tokens_is_one_plus_the_reach_probabilities():
    assert expectations_by_length([0.5, 0.5, 0.5])[0] == 1.0
    assert expectations_by_length([0.5, 0.5, 0.5])[2] == pytest.approx(1 + 0.5 + 0.25)
    assert expectations_by_length([1.0] * 7)[7] == 8.0


def test_acceptance_model_learns_from_reached_positions_only():
    model = AcceptanceModel()
    prior = model.probabilities([0.95], greedy=True)[0]
    assert prior == pytest.approx(0.95)                        # a bin's prior is its mid confidence
    for _ in range(50):  # confident drafts that are always rejected at position 1
        model.observe([0.95, 0.95, 0.95], greedy=True, verified=3, accepted=0)
    assert model.probabilities([0.95], greedy=True)[0] < 0.1
    # positions after the first rejection were never reached: their cells did not move
    assert model.counts[True][9][1] == pytest.approx(2.0 + 50)  # only position 1 of each cycle counted
    assert model.probabilities([0.95], greedy=False)[0] == pytest.approx(0.95)  # sampled rows: own table


def test_cost_model_interpolates_and_extrapolates_by_tokens():
    costs = CostModel()
    costs.observe_verify(1, 1, 0.060)
    costs.observe_verify(1, 8, 0.080)
    assert costs.verify(1, 4) == pytest.approx(0.060 + 3 * 0.020 / 7)
    assert costs.verify(8, 8) > costs.verify(1, 8)              # more tokens: a line through what was measured
    costs.observe_verify(1, 1, 0.100)                           # a second time is no lower: the first stays
    assert costs.verify(1, 1) == pytest.approx(0.060)
    costs.observe_verify(1, 1, 0.100)                           # then a moving average follows the machine
    assert 0.060 < costs.verify(1, 1) < 0.100
    costs.observe_draft(1, 0.010)
    assert costs.draft(1) == pytest.approx(0.010) and costs.draft(4) == pytest.approx(0.010)


def test_a_stalled_pass_enters_the_cost_figures_at_most_half_again_their_value():
    """One pass the host stalled (93 ms where passes take 30) counts as 45 ms, so it cannot price the
    next cycles out of speculating; a machine that really slowed down is followed within cycles; a
    figure near zero may grow by a millisecond at once."""
    costs = CostModel()
    for seconds in (0.030, 0.030, 0.093):                           # (the first two: see the next test)
        costs.observe_verify(1, 8, seconds)
    assert costs.verify(1, 8) == pytest.approx(0.8 * 0.030 + 0.2 * 0.045)
    for _ in range(30):
        costs.observe_verify(1, 8, 0.060)
    assert costs.verify(1, 8) == pytest.approx(0.060, rel=0.02)
    for seconds in (0.006, 0.006, 0.005):                           # faster: taken as it is
        costs.observe_draft(1, seconds)
    assert costs.draft(1) == pytest.approx(0.8 * 0.006 + 0.2 * 0.005)
    for seconds in (0.00001, 0.00001, 0.002):
        costs.observe_host(1, True, seconds)
    assert costs.host(1, True) == pytest.approx(0.8 * 0.00001 + 0.2 * 0.00101)


def test_a_figures_cold_first_time_gives_way_to_its_second():
    """The first pass of a shape in a process pays one-time costs (here a draft pass of 28 ms, then
    15 ms, as `generate --compare`'s warm-up measured on a 2-core CPU, and a verify pass 119 ms, then
    90): the second time replaces the first where lower, so a cold pass does not price the next dozens
    of cycles; after that the figures are moving averages. A draft pass priced before it is observed
    (`draft_after`) follows the same rule."""
    costs = CostModel()
    costs.observe_draft(1, 0.028)
    assert costs.draft_after(1, 0.015) == pytest.approx(0.015)
    costs.observe_draft(1, 0.015)
    assert costs.draft(1) == pytest.approx(0.015)
    costs.observe_draft(1, 0.017)
    assert costs.draft(1) == pytest.approx(0.8 * 0.015 + 0.2 * 0.017)
    costs.observe_verify(1, 8, 0.119)
    costs.observe_verify(1, 8, 0.090)
    assert costs.verify(1, 8) == pytest.approx(0.090)
    costs.observe_host(2, True, 0.004)
    costs.observe_host(2, True, 0.005)                              # slower the second time: the first stays
    assert costs.host(2, True) == pytest.approx(0.004)


def test_cost_model_follows_the_token_curve_at_the_level_of_the_batch():
    costs = CostModel()
    for q, s in ((1, 0.060), (8, 0.080), (32, 0.170), (128, 0.400)):   # start-up: one row, q tokens
        costs.observe_verify(1, q, s)
    slope = (0.400 - 0.170) / 96
    assert costs.verify(2, 256) == pytest.approx(0.400 + slope * 384)     # past the curve: its last slope
    assert costs.verify(4, 4) == pytest.approx(0.080 + (0.170 - 0.080) * 8 / 24)  # n = 16 on the curve
    costs.observe_verify(32, 1, 0.200)                 # batch 32 runs slower than one row of 32 tokens
    at_32 = (0.170 + 0.200) / 2                         # passes of equal tokens are averaged on the curve
    at_64 = at_32 + (0.400 - at_32) / 96 * 32
    assert costs.verify(32, 2) == pytest.approx(0.200 * at_64 / at_32)   # the curve's shape, batch 32's level
    assert costs.verify(32, 2) > costs.verify(32, 1)


def _costs(draft_s: float) -> CostModel:
    costs = CostModel()
    for q, s in ((1, 0.060), (8, 0.080)):
        costs.observe_verify(1, q, s)
    costs.observe_draft(1, draft_s)
    return costs


def _plan(policy: SpeculationPolicy, b: int = 1, offer: Offer | None = None) -> CyclePlan:
    return policy.prepare(b, offer or Offer([True] * b), 8)


def _plain_steps(policy: SpeculationPolicy, b: int, n: int, verify: float) -> list[CyclePlan]:
    """n cycles planned and observed as plain steps of `verify` seconds."""
    plans = []
    for _ in range(n):
        plans.append(_plan(policy, b))
        policy.observe(CycleRecord(b, Offer([True] * b), plans[-1], Choice.nothing(b), False, [0] * b, [0] * b, 1,
                                   0.0, verify))
    return plans


def test_confident_drafts_verify_the_whole_block():
    policy = SpeculationPolicy("auto", _costs(0.010))
    policy.probing = False
    plan = _plan(policy)
    assert plan.draft and not plan.probe
    assert plan.choose(Offer([True], [[0.99] * 7])).k == 7
    assert not policy.fallback.waiting


def test_backoff_waits_double_when_served_and_relax():
    backoff = Backoff.between(8, 64)
    assert not backoff.waiting
    waiting = backoff.wait(needed=3)                       # at least `length`
    assert waiting.left == 8 and waiting.waiting
    for _ in range(8):
        waiting = waiting.tick()
    assert not waiting.waiting and waiting.length == 16     # served: the next one is twice as long
    assert waiting.wait(needed=100).left == 64              # at most `longest`
    assert waiting.wait().cancel().length == 16             # a wait called off does not double
    assert waiting.relax().wait().left == 8


def test_deciding_writes_nothing_and_the_record_teaches_everything():
    """`prepare` and the plan's `choose` leave the policy as it was; `observe` is the only writer."""
    policy = SpeculationPolicy("auto", _costs(0.030), sources=2)
    offer = Offer([True], None, [[0.9] * 7])
    before = repr(vars(policy)), repr(policy.costs.__dict__)
    plan = policy.prepare(1, offer, 8)
    choice = plan.choose(Offer([True], [[0.6] * 7], [[0.9] * 7]), draft_seconds=0.040)
    assert (repr(vars(policy)), repr(policy.costs.__dict__)) == before
    policy.observe(CycleRecord(1, Offer([True], [[0.6] * 7], [[0.9] * 7]), plan, choice, True, list(choice.lengths),
                               [0], choice.k + 1, 0.020, 0.080))
    assert policy.costs.draft(1) == pytest.approx(0.020) and policy.evidence.weight > 0


def test_a_draft_that_cannot_pay_stops_after_a_few_cycles_for_a_budgeted_time():
    """A draft the calibration knows is never accepted: each block verifies nothing, so each cycle
    loses its draft pass (45 ms, 0.75 of a 60-ms plain step). One or two such cycles are weak
    evidence (the evidence is shrunk towards gain 0); within four its optimistic bound turns into a
    loss and the draft pass stops, for as long as keeps what they lost at 2 % of the fallback's
    time. Then a probe, and the next fallback is twice as long."""
    policy = SpeculationPolicy("auto", _costs(0.045), budget=0.02)
    policy.probing = False
    for _ in range(200):   # learned: this draft is never accepted
        policy.tables["draft"].observe([0.5], True, verified=1, accepted=0)
    cycles = _until_a_fallback(policy, 0.045, 0.5, 0, 4)
    assert [k for _, k, _, _ in cycles] == [0] * len(cycles) and len(cycles) >= 3
    assert cycles[-1][2] == math.ceil(len(cycles) * 0.045 / (0.02 * 0.060))
    plans = _plain_steps(policy, 1, policy.fallback.left, 0.060)
    assert all(p.fallback and not p.draft for p in plans)
    probe = _plan(policy)
    assert probe.draft and probe.probe                          # then a probe
    assert policy.fallback.length == 2 * len(plans)             # and the next fallback is twice as long


def test_a_probe_is_optimistic_and_one_rejected_block_is_weak_evidence():
    policy = SpeculationPolicy("auto", _costs(0.030))
    plan = _plan(policy)
    assert plan.probe                                            # the first cycle probes
    mean = SpeculationPolicy("auto", _costs(0.030))
    mean.probing = False
    offer = Offer([True], [[0.35] * 7])
    probe_k = plan.choose(offer).k
    assert probe_k > _plan(mean).choose(offer).k
    choice = Choice(probe_k, 1.0, 0.0, ("draft",), (probe_k,))
    policy.observe(CycleRecord(1, offer, plan, choice, True, [probe_k], [0], probe_k + 1, 0.030, 0.080, 0.0))
    plan = _plan(policy)
    assert plan.draft and not plan.probe and not policy.fallback.waiting   # rejected once: the draft goes on


def test_a_probe_that_cannot_pay_even_optimistically_verifies_nothing():
    """At batch 32 a verified token costs nearly a plain step: a weak draft's probe verifies nothing
    (the draft pass its only cost) instead of verifying drafts to learn what the bound already says;
    once the draft's usual yield is known to lose against a plain step of the batch, the draft pass
    is skipped (and retried after the skip back-off), before the fallback's verdict."""
    costs = CostModel()
    for q, s in ((1, 0.170), (2, 0.320), (4, 0.520), (8, 0.750)):
        costs.observe_verify(32, q, s)
    costs.observe_draft(32, 0.150)
    policy = SpeculationPolicy("auto", costs)
    for n in range(2):
        plan = _plan(policy, 32)
        assert plan.draft and plan.probe == (n == 0)
        offer = Offer([True] * 32, [[0.45] * 7] * 32)
        choice = plan.choose(offer)
        assert choice.k == 0 and not policy.fallback.waiting             # nothing verified, and no verdict yet
        policy.observe(CycleRecord(32, offer, plan, choice, True, [0] * 32, [0] * 32, 1, 0.150, 0.170))
    plan = _plan(policy, 32)
    assert not plan.draft and not plan.fallback and plan.skips.waiting    # skipped: a plain step pays more
    policy.observe(CycleRecord(32, Offer([False] * 32, None), plan, plan.choose(Offer([False] * 32, None)),
                               False, [0] * 32, [0] * 32, 1, 0.0, 0.170))
    assert policy.draft_skips.waiting and not _plan(policy, 32).draft


def test_a_batch_drafts_only_where_the_draft_beats_a_plain_step():
    """In a batch the draft pass runs only while the draft's usual yield beats a plain step of the
    batch (a verified token costs nearly a plain step here, and the draft's proposals verify nothing);
    alone (b == 1) the draft keeps running where lookup offers nothing, and the fallback judges it."""
    def drafts_after_two_weak_cycles(b):
        costs = CostModel()
        for q, s in ((1, 0.030), (2, 0.055), (4, 0.100), (8, 0.190)):
            costs.observe_verify(b, q, s)
        costs.observe_draft(b, 0.020)
        policy = SpeculationPolicy("auto", costs)
        for _ in range(2):                                                # the probe, then one draft cycle
            plan = _plan(policy, b)
            offer = Offer([True] * b, [[0.45] * 7] * b)
            choice = plan.choose(offer)
            policy.observe(CycleRecord(b, offer, plan, choice, True, [0] * b, [0] * b, 1, 0.020, 0.030))
        return _plan(policy, b).draft
    assert not drafts_after_two_weak_cycles(8) and drafts_after_two_weak_cycles(1)


def test_fresh_keeps_the_machine_and_forgets_the_draft():
    policy = SpeculationPolicy("auto", _costs(0.045), budget=0.05)
    policy.tables["draft"].observe([0.5], True, verified=1, accepted=0)
    policy.fallback, policy.probing = policy.fallback.wait(40), False
    fresh = policy.fresh()
    assert fresh.costs is policy.costs and fresh.settings.budget == 0.05 and fresh.mode == "auto"
    assert not fresh.fallback.waiting and fresh.probing and not fresh.tables["draft"].counts
    policy.evidence.add(-1.0)
    assert policy.fresh().evidence.weight == 0.0 and policy.fresh().stretch == 0.0


def _simulate(policy: SpeculationPolicy, b: int, accept: float, cycles: int, seed: int = 0):
    """Decode `cycles` cycles of a batch of b rows against a synthetic machine (verify = 40 ms +
    2 ms per token, draft pass 20 ms) whose drafts are accepted with probability `accept`, at
    confidence 0.5; returns (seconds, tokens) of the run."""
    rng = random.Random(seed)
    seconds = tokens = 0.0
    policy.costs.observe_verify(1, 1, 0.042)
    policy.costs.observe_verify(1, 8, 0.056)
    for _ in range(cycles):
        plan = _plan(policy, b)
        if not plan.draft:
            verify = 0.040 + 0.002 * b
            nothing = Choice(0, b, 0.0, ("",) * b, (0,) * b)
            policy.observe(CycleRecord(b, Offer([True] * b), plan, nothing, False, [0] * b, [0] * b, 1, 0.0, verify))
            seconds, tokens = seconds + verify, tokens + b
            continue
        confidence = [[0.5] * 7 for _ in range(b)]
        offer = Offer([True] * b, confidence)
        choice = plan.choose(offer, 0.020)
        k = choice.k
        accepted = []
        for _ in range(b):
            n = 0
            while n < k and rng.random() < accept:
                n += 1
            accepted.append(n)
        verify = 0.040 + 0.002 * b * (k + 1)
        policy.observe(CycleRecord(b, offer, plan, choice, True, list(choice.lengths), accepted, k + 1, 0.020, verify))
        seconds, tokens = seconds + 0.020 + verify, tokens + sum(accepted) + b
    return seconds, tokens


@pytest.mark.parametrize("b", [1, 8, 32])
def test_a_draft_that_is_never_accepted_costs_at_most_the_budget_after_its_first_probe(b):
    policy = SpeculationPolicy("auto", budget=0.02)
    seconds, tokens = _simulate(policy, b, accept=0.0, cycles=3000)
    plain = tokens / b * (0.040 + 0.002 * b)
    first_probe = 0.020 + 0.002 * b * 7                          # the most the first probe can lose
    assert seconds <= plain * 1.02 + first_probe


@pytest.mark.parametrize("b", [1, 8])
def test_a_draft_that_pays_keeps_speculating(b):
    policy = SpeculationPolicy("auto")
    seconds, tokens = _simulate(policy, b, accept=0.9, cycles=300)
    plain = tokens / b * (0.040 + 0.002 * b)
    assert seconds < 0.6 * plain                                 # most cycles speculated, with long blocks


def test_modes_always_and_never():
    assert all(_plan(SpeculationPolicy("always")).draft for _ in range(5))
    assert not SpeculationPolicy("always").prepare(1, Offer([True]), 8, can_draft=False).draft
    assert _plan(SpeculationPolicy("always")).choose(Offer([True], [[0.0] * 7])).k == 7
    assert not any(_plan(SpeculationPolicy("never")).draft for _ in range(5))
    with pytest.raises(ValueError):
        SpeculationPolicy("sometimes")


def test_an_observed_figure_replaces_the_calibrated_one_and_a_disagreement_makes_it_stale():
    costs = CostModel()
    costs.load_calibration({(1, 1): 0.040, (1, 8): 0.400})      # measured while the machine was loaded
    costs.observe_verify(1, 8, 0.050)
    assert costs.verify(1, 8) == pytest.approx(0.050)             # used at once, not averaged in
    assert not costs.stale()                                      # one pass is not enough to call it stale
    for _ in range(3):
        costs.observe_verify(1, 8, 0.050)
    assert not costs.stale()                                      # one size seen: not enough to replace it with
    for _ in range(4):
        costs.observe_verify(1, 4, 0.045)
    assert not costs.stale()        # wide passes only: no plain step to weigh them against (it would be
    costs.observed_s.pop((1, 4)); costs.observed_n.pop((1, 4))    # extrapolated from them)
    for _ in range(4):
        costs.observe_verify(1, 1, 0.041)
    costs.observe_verify(1, 32, 0.090)
    assert costs.stale()
    table = costs.adopt_observed()
    assert table == {(1, 1): pytest.approx(0.041), (1, 8): pytest.approx(0.050)}  # seen often enough; the rest
    assert not costs.stale() and costs.verify(1, 32) == pytest.approx(0.090)      # of a wrong calibration is dropped
    assert costs.verify(1, 4, optimistic=True) <= costs.verify(1, 4)


def test_the_optimistic_figure_trusts_only_what_this_run_observed():
    costs = CostModel()
    costs.load_calibration({(1, 1): 0.040, (1, 8): 0.400})
    assert costs.verify(1, 8, optimistic=True) == pytest.approx(0.400)   # nothing observed: the calibration
    costs.observe_verify(1, 1, 0.040)
    assert costs.verify(1, 8, optimistic=True) == pytest.approx(0.040)   # only the plain step seen: a flat curve
    assert costs.verify(1, 8) == pytest.approx(0.400)


def _lookup_run(calibrated_wide: float, true_wide: float, cycles: int = 600, accept: float = 0.9, seed: int = 0):
    """Lookup alone against a machine whose 8-token pass takes `true_wide` (a plain step 40 ms),
    with a stored calibration saying `calibrated_wide`; lookup offers 7 tokens at confidence 0.9,
    accepted with probability `accept`. Returns (seconds, tokens, cycles that verified lookup tokens)."""
    rng = random.Random(seed)
    costs = CostModel()
    costs.load_calibration({(1, 1): 0.040, (1, 8): calibrated_wide})
    policy = SpeculationPolicy("auto", costs, budget=0.02)
    seconds = tokens = 0.0
    speculative = 0
    for _ in range(cycles):
        offer = Offer([True], None, [[0.9] * 7])
        plan = policy.prepare(1, offer, 8, can_draft=False)
        choice = plan.choose(offer)
        k = choice.k
        n = 0
        while n < k and rng.random() < accept:
            n += 1
        verify = 0.040 + (true_wide - 0.040) * k / 7
        policy.observe(CycleRecord(1, offer, plan, choice, False, list(choice.lengths), [n], k + 1, 0.0, verify))
        seconds, tokens, speculative = seconds + verify, tokens + n + 1, speculative + (k > 0)
    return seconds, tokens, speculative


def test_a_calibration_that_overstates_wide_passes_cannot_switch_lookup_off():
    """Stored while the machine was loaded: the 8-token pass at 10 plain steps, so no lookup could
    ever pay by those figures. The first probe measures it (50 ms) and lookup runs from then on."""
    seconds, tokens, speculative = _lookup_run(calibrated_wide=0.400, true_wide=0.050)
    assert speculative > 500
    assert seconds < 0.5 * tokens * 0.040


def test_probing_a_calibration_that_was_right_costs_at_most_the_budget():
    """The same figures, but true: lookup never pays, and probing it costs at most `budget` of plain
    decoding's time beyond the first probe."""
    seconds, tokens, speculative = _lookup_run(calibrated_wide=0.400, true_wide=0.400, cycles=3000, accept=0.0)
    assert 1 <= speculative <= 3
    assert seconds <= tokens * 0.040 * 1.02 + (0.400 - 0.040)


def test_at_batch_8_lookup_is_not_verified_at_a_width_its_mean_does_not_pay_for():
    """Width is expensive at batch 8 (an 8-token pass costs three plain steps) and lookup's tokens are
    accepted 35 % of the time: at that mean no width pays, only the optimistic bound of a young
    table would (mean + 1 sd). One budgeted lookup probe verifies at the bound; the cycles after it
    verify nothing, instead of paying for exploration every cycle."""
    costs = CostModel()
    for q, s in ((1, 0.200), (2, 0.300), (4, 0.350), (8, 0.600)):
        costs.observe_verify(8, q, s)
    policy = SpeculationPolicy("auto", costs, budget=0.02)
    offer, pricing = Offer([True] * 8, None, [[0.35] * 7] * 8), Pricing(costs, 8)
    plan = policy.prepare(8, offer, 8, can_draft=False)
    probe = plan.choose(offer)
    wait = probe.lookup_probes.left
    assert probe.k > 0 and wait > 0                                 # the bound is tried once ...
    mean_rate = 8 * expectations_by_length([0.35] * 7)[probe.k] / pricing.cycle(probe.k, False)
    assert mean_rate < pricing.plain_rate()                         # ... though at the mean it does not pay
    lost = pricing.cycle(probe.k, False) - expectations_by_length([0.35] * 7)[probe.k] * 0.200
    assert wait >= lost / (0.02 * 0.200) - 1                        # ... and budgeted by what it can lose
    policy.observe(CycleRecord(8, offer, plan, probe, False, list(probe.lengths), [0] * 8, probe.k + 1, 0.0,
                               costs.verify(8, probe.k + 1)))
    waits = []
    for _ in range(wait):
        plan = policy.prepare(8, offer, 8, can_draft=False)
        waits.append(plan.choose(offer))
        policy.observe(CycleRecord(8, offer, plan, waits[-1], False, [0] * 8, [0] * 8, 1, 0.0, 0.200))
    assert [c.k for c in waits] == [0] * wait                       # plain steps until the next probe


# ---------------------------------------------------------------------- a fixed batch
def _two_rows(plain_one_row: float) -> tuple[SpeculationPolicy, Offer, list[int]]:
    """Two rows with 40 tokens of room each: lookup offers 7 tokens it is 95 % sure of for the first
    and nothing for the second; a plain step of both rows costs 0.1 s, an 8-token pass 0.2 s, and a
    plain step of one row `plain_one_row`."""
    costs = CostModel()
    for b, q, s in ((1, 1, plain_one_row), (2, 1, 0.100), (2, 8, 0.200)):
        costs.observe_verify(b, q, s)
    return SpeculationPolicy("auto", costs), Offer([True, True], None, [[0.95] * 7, []]), [40, 40]


def test_a_fixed_batch_does_not_make_the_row_lookup_cannot_help_wait_through_wide_passes():
    """A pass costs the same for one row as for two (0.1 s): the second row needs 40 plain steps
    whatever the first does, so an 8-token pass only makes it wait longer (the batch ends no
    sooner). A batch that refills counts the first row's tokens per second and verifies them; a
    fixed batch (the time until its last row ends) takes the plain step."""
    policy, offer, room = _two_rows(plain_one_row=0.100)
    assert policy_choice(policy, 2, offer).k == 7                     # an open batch: 7.6 tokens in 0.2 s
    fixed = policy_choice(policy.fresh(), 2, Offer(offer.greedy, None, offer.lookup, remaining=room))
    assert fixed.k == 0 and fixed.rate == pytest.approx(Pricing(policy.costs, 2).plain_rate())


def test_a_fixed_batch_verifies_width_when_finishing_rows_early_makes_the_rest_cheaper():
    """Where a pass costs per row (one row 0.05 s, two 0.1 s) the first row's early end halves the
    second row's steps: the same width is worth it, and the fixed batch's rate is the open batch's
    (saved time is then proportional to the tokens committed)."""
    policy, offer, room = _two_rows(plain_one_row=0.050)
    open_choice = policy_choice(policy, 2, offer)
    fixed = policy_choice(policy.fresh(), 2, Offer(offer.greedy, None, offer.lookup, remaining=room))
    assert fixed.k == open_choice.k == 7
    assert fixed.rate == pytest.approx(open_choice.rate)


def test_plain_decoding_time_of_a_fixed_batch_counts_the_rows_still_running():
    from dflash2.decoding.policy.expectation import plain_seconds, saved_seconds, step_curve
    steps = [0.05, 0.08, 0.1]                                          # 1, 2, 3 rows
    assert plain_seconds([2, 5, 3], steps) == pytest.approx(2 * 0.1 + 1 * 0.08 + 2 * 0.05)
    assert saved_seconds([2, 5, 3], [1, 1, 1], steps) == pytest.approx(0.1)   # a plain step saves its time
    assert saved_seconds([2, 5, 3], [4, 4, 4], steps) == pytest.approx(plain_seconds([2, 5, 3], steps) - 0.05)
    assert step_curve(6, lambda n: 0.1 * n * n) == pytest.approx([0.1, 0.4, 1.0, 1.6, 2.6, 3.6])  # 1, 2, 4, 6 exact


def test_a_batch_size_whose_plain_step_was_never_timed_takes_one_first():
    """A stored table adopted from a batch-8 run has no one-row figures: a one-row plain step is then
    predicted at the price of the narrowest pass known (8 tokens), so any lookup match looks like it
    pays and, verified every cycle, no plain step ever shows otherwise (the demo's chat prompt). The
    first cycle at a batch size the run has not timed a plain step at is one; then the rate decides."""
    costs = CostModel()
    costs.load_calibration({(8, 1): 0.090, (8, 8): 0.290})
    costs.observe_verify(1, 8, 0.080)
    policy = SpeculationPolicy("auto", costs)
    offer = Offer([True], None, [[0.05] + [0.5] * 6])                # a 5 % first token: never worth a pass
    assert costs.verify(1, 1) == pytest.approx(costs.verify(1, 8))   # what the old rule weighed
    plan = _plan(policy, 1, offer)
    assert not plan.draft and plan.choose(offer).k == 0
    policy.observe(CycleRecord(1, offer, plan, Choice(0, 1.0, 0.0, ("",), (0,)), False, [0], [0], 1, 0.0, 0.040))
    policy.lookup_probes = policy.lookup_probes.wait(10)              # no lookup probe: the mean decides
    plan = _plan(policy, 1, offer)
    assert plan.draft and plan.choose(offer).k == 0                   # timed: it does not pay


def test_a_young_bin_inherits_how_the_sources_other_bins_turned_out():
    """Lookup matches that chat text rejects (bins 3-5) make a bin never yet reached (bin 7) expect
    less than its face value, and matches that are always accepted make it expect more: a source is
    not tried bin by bin at the confidence it claims."""
    rejected, accepted = AcceptanceModel(), AcceptanceModel()
    for c in (0.35, 0.45, 0.55) * 4:
        rejected.observe([c], greedy=True, verified=1, accepted=0)
        accepted.observe([c], greedy=True, verified=1, accepted=1)
    face = AcceptanceModel().probabilities([0.75], greedy=True)[0]
    assert face == pytest.approx(0.75)
    assert rejected.probabilities([0.75], greedy=True)[0] < 0.25 < 0.9 < accepted.probabilities([0.75], greedy=True)[0]
    assert rejected.probabilities([0.75], greedy=False)[0] == pytest.approx(0.75)   # sampled rows: their own


def test_two_explored_sources_share_one_exploration_budget():
    """Hybrid explores the draft and lookup: each waits twice as long between probes as a source
    explored alone, so the two together cost at most the `budget` that one alone may."""
    waits = []
    for sources in (1, 2):
        costs = CostModel()
        for q, s in ((1, 0.200), (8, 0.600)):
            costs.observe_verify(8, q, s)
        policy = SpeculationPolicy("auto", costs, budget=0.01, sources=sources)
        probe = policy_choice(policy, 8, Offer([True] * 8, None, [[0.35] * 7] * 8))
        assert probe.k > 0                                                                 # a lookup probe
        waits.append(probe.lookup_probes.left)
        assert policy.fresh().settings.sources == sources
    assert waits[1] >= 2 * waits[0] - 1


def test_a_plain_step_of_more_rows_never_costs_less():
    """Noisy timings can put 4 rows below 3; the fixed batch's objective then takes the dearer figure,
    so a cycle never saves a negative time."""
    from dflash2.decoding.policy.expectation import saved_seconds, step_curve
    steps = step_curve(4, {1: 0.05, 2: 0.08, 4: 0.0}.__getitem__)
    assert steps == sorted(steps) and steps[0] == 0.05
    assert saved_seconds([35, 40, 20, 11], [1.0, 4.0, 2.5, 4.0], steps) > 0


@pytest.mark.parametrize("mode", ["always", "auto"])
def test_every_choice_names_a_source_for_every_row(mode):
    """Whatever the cost model has seen (zero or tiny timings, a curve that falls with rows), the
    choice has one source and length per row: the engine assembles its block from them. (A fixed
    batch whose every rate came out negative once left the choice empty, and the engine failed.)"""
    rng = random.Random(0)
    for _ in range(400):
        costs = CostModel()
        b = rng.choice([1, 2, 3, 4, 8])
        for _ in range(rng.randint(0, 6)):
            costs.observe_verify(rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8]),
                                 rng.choice([0.0, 1e-7, rng.random() * 0.2]))
        lookup = [[rng.random() for _ in range(rng.randint(0, 7))] for _ in range(b)]
        remaining = [rng.randint(0, 40) for _ in range(b)] if rng.random() < 0.7 else None
        choice = policy_choice(SpeculationPolicy(mode, costs), b, Offer([True] * b, None, lookup, remaining=remaining))
        assert len(choice.sources) == len(choice.lengths) == b
        assert choice.k == max(choice.lengths)


def _cycles(policy: SpeculationPolicy, draft_s: float, confidence: float, accepted: int, cycles: int):
    """`cycles` draft cycles (plain steps in between skipped over) of drafts at `confidence`, each
    accepting `accepted` (80 ms pass, or the 60-ms plain step when nothing is verified) -> per draft
    cycle (probe, k, fallback started, backoff)."""
    out = []
    while len(out) < cycles:
        plan = _plan(policy)
        if not plan.draft:
            _plain_steps(policy, 1, 1, 0.060)   # (observes another plan: the same, a plain step)
            continue
        offer = Offer([True], [[confidence] * 7])
        choice = plan.choose(offer, draft_s)
        policy.observe(CycleRecord(1, offer, plan, choice, True, [choice.k], [min(accepted, choice.k)],
                                   choice.k + 1, draft_s, 0.080 if choice.k else 0.060, 0.0))
        out.append((plan.probe, choice.k, policy.fallback.left, policy.fallback.length))
    return out


def _until_a_fallback(policy: SpeculationPolicy, draft_s: float, confidence: float, accepted: int, most: int):
    """`_cycles` one at a time until one starts a fallback (at most `most`)."""
    out = []
    while len(out) < most and not (out and out[-1][2]):
        out += _cycles(policy, draft_s, confidence, accepted, 1)
    return out


def test_rejected_blocks_stop_the_draft_once_the_evidence_says_it_loses():
    """Every block rejected at its first token, 50 ms lost a cycle (0.83 of a plain step): the first
    rejection is weak evidence, the draft pass stops within four cycles, for what they lost at the
    budget's 2 %; rejected again and again, fallbacks grow to `max_backoff`."""
    policy = SpeculationPolicy("auto", _costs(0.030), budget=0.02)
    cycles = _cycles(policy, 0.030, 0.6, 0, 12)
    assert cycles[0][0] and cycles[0][1] > 0 and cycles[0][2] == 0      # a probe, rejected: the draft goes on
    first = next(i for i, (_, _, left, _) in enumerate(cycles) if left)
    assert 1 <= first <= 3
    assert cycles[first][2] == math.ceil((first + 1) * (0.030 + 0.080 - 0.060) / (0.02 * 0.060))
    assert cycles[-1][3] == policy.settings.max_backoff                      # the evidence piled up: long fallbacks


def _calibrated(policy: SpeculationPolicy, b: int, cycles: int, seed: int = 0, draft_s: float = 0.008):
    """A trained draft on a machine where a plain step is 45 ms and each verified token adds 3 ms
    (8 ms draft pass): each block's confidence varies (a first token between 0.05 and 0.95, later
    ones lower) and is calibrated (token j is accepted with its confidence). -> (seconds, tokens,
    draft cycles, fallbacks)."""
    rng = random.Random(seed)
    policy.costs.observe_verify(b, 1, 0.045)
    policy.costs.observe_verify(b, 8, 0.066)
    seconds = tokens = drafted = fallbacks = 0
    for _ in range(cycles):
        plan = _plan(policy, b)
        if not plan.draft:
            seconds, tokens = seconds + 0.045, tokens + b
            policy.observe(CycleRecord(b, Offer([True] * b), plan, Choice(0, b, 0.0, ("",) * b, (0,) * b), False,
                                       [0] * b, [0] * b, 1, 0.0, 0.045))
            continue
        drafted += 1
        confidence = []
        for _ in range(b):
            c = rng.uniform(0.05, 0.95)
            confidence.append([c * 0.9 ** j for j in range(7)])
        offer = Offer([True] * b, confidence)
        choice = plan.choose(offer, draft_s)
        accepted = []
        for r in range(b):
            n = 0
            while n < choice.lengths[r] and rng.random() < confidence[r][n]:
                n += 1
            accepted.append(n)
        verify = 0.045 + 0.003 * choice.k
        before = policy.fallback.left
        policy.observe(CycleRecord(b, offer, plan, choice, True, list(choice.lengths), accepted, choice.k + 1,
                                   draft_s, verify))
        fallbacks += policy.fallback.left > before
        seconds, tokens = seconds + draft_s + verify, tokens + sum(accepted) + b
    return seconds, tokens, drafted, fallbacks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_draft_that_pays_on_balance_is_not_stopped_by_unlucky_blocks(seed):
    """A calibrated draft with good and bad blocks: unsure blocks verify nothing and rejected ones
    happen in runs, but on balance it gains, so the draft pass never stops (the old rules stopped
    it for a dozen to hundreds of steps after one unsure block or a few rejections) and the run is
    well ahead of plain decoding."""
    policy = SpeculationPolicy("auto")
    seconds, tokens, drafted, fallbacks = _calibrated(policy, 1, 600, seed)
    assert fallbacks == 0 and drafted == 600
    assert seconds < 0.85 * tokens * 0.045
    assert policy.evidence.mean() > 0


def test_a_probe_that_pays_ends_and_speculation_goes_on():
    policy = SpeculationPolicy("auto", _costs(0.030))
    plan = _plan(policy)
    assert plan.probe
    offer = Offer([True], [[0.6] * 7])
    choice = plan.choose(offer, 0.030)
    policy.observe(CycleRecord(1, offer, plan, choice, True, [choice.k], [choice.k], choice.k + 1, 0.030, 0.080, 0.0))
    plan = _plan(policy)
    assert plan.draft and not plan.probe and not policy.fallback.waiting


def test_the_first_draft_probe_waits_for_a_row_that_lookup_leaves_uncovered():
    """Hybrid, before the draft has been measured: a cycle whose rows lookup all serve well is not
    spent on the draft's probe (its pass would lose to lookup there and fall back for it); a cycle
    with a row that lookup has nothing for runs it. Once the draft has a yield, that decides."""
    policy = SpeculationPolicy("auto", _costs(0.030), sources=2)

    def worth(b: int, offer: Offer) -> bool:
        return worth_drafting(policy.tables, policy.costs, b, 8, offer, policy.outlook, policy.draft_skips)[0]
    covered = Offer([True], None, [[0.7] * 7])
    assert not worth(1, covered) and not _plan(policy, 1, covered).draft
    assert worth(1, Offer([True], None, [[]])) and _plan(policy, 1, Offer([True], None, [[]])).draft
    assert worth(2, Offer([True] * 2, None, [[0.95] * 7, []]))
    policy.outlook = (7.0, 7.5)                                  # a draft that usually gives 7.5 tokens a row
    assert worth(1, covered)


def test_a_few_poor_blocks_do_not_stop_a_draft_that_usually_pays_beside_lookup():
    """Hybrid: the draft's usual yield is a slow average of its cycles' (the first ones equally), so
    after 40 blocks worth 3 tokens, three blocks worth 1 leave it near 3 and a cycle lookup covers
    still runs the draft pass (a moving average of weight 0.2 would be at 2.0 and skip it); 60 more
    blocks worth 1 do bring it down, and the pass is skipped."""
    policy = SpeculationPolicy("auto", _costs(0.030), sources=2)
    covered = Offer([True], None, [[0.3] * 7])                   # lookup alone would gain a little here

    def learn(tokens: float) -> None:
        plan = policy.prepare(1, Offer([True], [[0.6] * 7], None), 8)
        choice = Choice(7, tokens, 0.0, ("draft",), (7,), draft_yield=(7, tokens))
        policy.observe(CycleRecord(1, Offer([True], [[0.6] * 7], None), plan, choice, True, [7], [round(tokens) - 1],
                                   8, 0.030, 0.080))
    for _ in range(40):
        learn(3.0)
    assert policy.outlook[1] == pytest.approx(3.0)
    for _ in range(3):
        learn(1.0)
    assert policy.outlook[1] > 2.7
    assert worth_drafting(policy.tables, policy.costs, 1, 8, covered, policy.outlook, policy.draft_skips)[0]
    for _ in range(60):
        learn(1.0)
    assert policy.outlook[1] < 1.3
    assert not worth_drafting(policy.tables, policy.costs, 1, 8, covered, policy.outlook, policy.draft_skips)[0]


def test_ordinary_cycles_that_lose_fall_back_once_they_have_spent_what_the_draft_gained():
    """A probe pays (its whole block accepted: 8 tokens in 110 ms against 480 ms of plain steps), then
    every block is rejected at its first token while the draft's confidence stays high. The
    calibration keeps expecting a good yield; what the cycles realise decides: each loses 50 ms, and
    once they have lost about what the probe gained the draft pass stops."""
    policy = SpeculationPolicy("auto", _costs(0.030), budget=0.02)
    for _ in range(3):                                           # what the draft did before: it paid
        policy.tables["draft"].observe([0.95] * 7, True, verified=7, accepted=7)
    (probe, k, left, _), = _cycles(policy, 0.030, 0.95, 7, 1)
    assert probe and k == 7 and left == 0                          # the probe paid: speculation goes on
    ordinary = _until_a_fallback(policy, 0.030, 0.95, 0, 12)
    assert [p for p, *_ in ordinary] == [False] * len(ordinary)
    assert ordinary[-1][2] and 5 <= len(ordinary) <= 10           # about 0.37 s gained, then 50 ms a cycle lost
    assert policy.stretch == 0.0                                   # the fallback settled it


def test_a_cycle_that_gains_pays_back_what_earlier_ones_lost():
    """Rejected blocks alternate with blocks accepted whole: the gains pay back each loss, so the draft
    pass never stops and what the stretch lost never piles up."""
    policy = SpeculationPolicy("auto", _costs(0.030), budget=0.02)
    for _ in range(3):
        policy.tables["draft"].observe([0.95] * 7, True, verified=7, accepted=7)
    for n in range(20):
        cycle, = _cycles(policy, 0.030, 0.95, 7 if n % 3 == 2 else 0, 1)
        assert cycle[2] == 0
    assert policy.stretch <= 2 * 0.050 and policy.evidence.mean() > 0


def test_a_probe_that_gains_against_plain_steps_goes_on_whatever_the_calibration_expects():
    """The calibration has seen a block rejected at this confidence; each block then commits 3 tokens
    in 140 ms (draft pass 60, pass 80) against 180 ms of plain steps: a gain, though the posterior
    mean says the draft does not pay. What the cycles realise decides: speculation goes on."""
    policy = SpeculationPolicy("auto", _costs(0.060), budget=0.02)
    policy.tables["draft"].observe([0.5] * 7, True, verified=7, accepted=0)
    cycles = _cycles(policy, 0.060, 0.5, 2, 3)
    assert [probe for probe, *_ in cycles] == [True, False, False]
    assert [left for _, _, left, _ in cycles] == [0, 0, 0] and policy.stretch == 0.0


def test_in_hybrid_a_draft_cycle_is_judged_against_what_lookup_alone_was_expected_to_gain():
    """Lookup offers a confident block: the best choice without the draft is expected to gain, so a
    draft cycle is measured against that (`Choice.baseline` < 0), not against plain steps; for the
    draft alone the baseline is a plain step (0)."""
    policy = SpeculationPolicy("auto", _costs(0.010), sources=2)
    policy.probing = False
    for _ in range(20):
        policy.tables["lookup"].observe([0.9] * 7, True, verified=7, accepted=7)
    offer = Offer([True], [[0.6] * 7], [[0.9] * 7])
    choice = policy_choice(policy, 1, offer)
    assert choice.baseline < -0.05                                 # lookup alone: several tokens for one pass
    alone = SpeculationPolicy("auto", _costs(0.010))
    alone.probing = False
    assert policy_choice(alone, 1, Offer([True], [[0.6] * 7])).baseline == pytest.approx(0.0, abs=1e-12)


def _lagging_row_cycles(fixed: bool, cycles: int) -> list[int]:
    """Ordinary draft cycles of 8 rows on a machine whose plain step costs about the same for 1 row
    as for 8 (68 / 70 ms; a draft cycle 150 ms): seven rows accept every draft, one rejects every
    block -> per cycle the fallback started (0: none). `fixed`: a fixed batch (`Offer.remaining`)."""
    costs = CostModel()
    for b, q, s in ((1, 1, 0.068), (8, 1, 0.070), (8, 8, 0.120)):
        costs.observe_verify(b, q, s)
    costs.observe_draft(8, 0.030)
    policy = SpeculationPolicy("auto", costs, budget=0.02)
    for _ in range(3):
        policy.tables["draft"].observe([0.95] * 7, True, verified=7, accepted=7)
    policy.probing = False                                       # a probe has paid
    remaining, out = [200] * 8, []
    while len(out) < cycles:
        plan = _plan(policy, 8)
        if not plan.draft:
            _plain_steps(policy, 8, 1, 0.070)
            continue
        offer = Offer([True] * 8, [[0.95] * 7] * 8, remaining=list(remaining) if fixed else None)
        choice = plan.choose(offer, 0.030)
        accepted = [0] + [choice.k] * 7
        policy.observe(CycleRecord(8, offer, plan, choice, True, list(choice.lengths), accepted, choice.k + 1,
                                   0.030, 0.120))
        remaining = [r - a - 1 for r, a in zip(remaining, accepted)]
        out.append(policy.fallback.left)
    return out


def test_a_fixed_batch_judges_what_its_cycles_realised_by_when_its_last_row_ends():
    """Seven rows of a fixed batch race ahead, one is rejected every block: 57 tokens a cycle (0.5 s
    of plain steps by the token count), but the batch ends when its lagging row does, and that row
    gained one token per 150 ms -- each cycle saves 84 ms of the batch's plain decoding (eight
    70-ms steps become one at 70 ms and seven one-row steps at 68 ms later) and loses 66 ms: the
    draft pass stops within a few cycles. A batch that refills (the server's:
    tokens per second) keeps the draft on: there the 57 tokens are what counts."""
    fixed = _lagging_row_cycles(True, 6)
    assert fixed[0] == 0 and any(fixed[1:3])                     # a few cycles that lose: the draft pass stops
    assert _lagging_row_cycles(False, 10) == [0] * 10
