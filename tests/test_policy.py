"""The cost side of the loop: expected tokens, the acceptance calibration, the cost model and the
speculation policy's choices (pure Python: no model runs)."""
from __future__ import annotations

import pytest

from dflash2.decoding.costs import CostModel
from dflash2.decoding.policy import AcceptanceModel, SpeculationPolicy, expected_tokens


def test_expected_tokens_is_one_plus_the_reach_probabilities():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([1.0] * 7, 7) == 8.0


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
    costs.observe_verify(1, 1, 0.100)                           # a moving average follows the machine
    assert 0.060 < costs.verify(1, 1) < 0.100
    costs.observe_draft(1, 0.010)
    assert costs.draft(1) == pytest.approx(0.010) and costs.draft(4) == pytest.approx(0.010)


def _policy(draft_s: float) -> SpeculationPolicy:
    costs = CostModel()
    for q, s in ((1, 0.060), (8, 0.080)):
        costs.observe_verify(1, q, s)
    costs.observe_draft(1, draft_s)
    return SpeculationPolicy("auto", costs)


def test_confident_drafts_verify_the_whole_block_and_weak_ones_fall_back():
    policy = _policy(0.010)
    policy.probing = False
    assert policy.plan(1).draft
    assert policy.choose_length(1, [[0.99] * 7], [True], block=8) == 7
    weak = _policy(0.045)
    weak.probing = False
    lengths = [weak.choose_length(1, [[0.02] * 7], [True], block=8) for _ in range(weak.patience)]
    assert max(lengths) <= 1   # once drafted (a sunk cost), one more verified token is nearly free
    plans = [weak.plan(1) for _ in range(weak.min_backoff)]
    assert not any(p.draft for p in plans)                      # fallback: plain steps, no draft pass
    probe = weak.plan(1)
    assert probe.draft and probe.probe                          # then one probe with the whole block
    assert weak.choose_length(1, [[0.02] * 7], [True], block=8, probe=True) == 7
    weak.observe(1, 8, [[0.02] * 7], [True], [7], [0], 0.045, 0.080, 0.001, probe=True)
    assert weak.plain_left == 2 * weak.min_backoff              # the probe did not pay: a longer fallback


def test_modes_always_and_never():
    assert all(SpeculationPolicy("always").plan(1).draft for _ in range(5))
    assert SpeculationPolicy("always").choose_length(1, [[0.0] * 7], [True], block=8) == 7
    assert not any(SpeculationPolicy("never").plan(1).draft for _ in range(5))
    with pytest.raises(ValueError):
        SpeculationPolicy("sometimes")
