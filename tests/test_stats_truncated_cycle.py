"""Statistics of a final cycle cut short by max_new_tokens: the histogram and the per-position
acceptance count the same (committed) tokens."""
from __future__ import annotations

from conftest import OracleDecoder
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.loop.stats import RowStats
from dflash2.decoding.verifier.adapter import TargetAdapter

BLOCK = 4
FULL_CYCLES = 3


def test_truncated_last_cycle_counts_alike(tiny_models):
    target, _ = tiny_models["llama"]
    prompt = [5, 17, 33, 9]
    plain = SpeculativeDecoder(TargetAdapter(target))
    [reference] = plain.generate([prompt], GenerationConfig(max_new_tokens=40))
    # An oracle draft is always right: every cycle commits BLOCK tokens (BLOCK - 1 drafts + the bonus),
    # after the prefill's one; 2 more tokens end mid-block, in a cycle that commits 2 accepted drafts.
    decoder = OracleDecoder(TargetAdapter(target), [prompt], [reference.tokens], BLOCK)
    [result] = decoder.generate([prompt], GenerationConfig(max_new_tokens=1 + FULL_CYCLES * BLOCK + 2))
    stats = result.stats
    assert result.tokens == reference.tokens[:len(result.tokens)] and stats.new_tokens == len(result.tokens) == 15
    assert stats.cycles == FULL_CYCLES + 1 and stats.committed_per_cycle == [BLOCK] * FULL_CYCLES + [2]
    assert stats.histogram() == {1: 0, 2: 1, 3: 0, 4: FULL_CYCLES}
    assert stats.accepted_at_position == [FULL_CYCLES + 1, FULL_CYCLES + 1, FULL_CYCLES]
    # the two views agree: every committed token after the prefill's is in the histogram, and each
    # cycle counts in position k exactly when it committed more than k accepted drafts
    assert sum(tau * n for tau, n in stats.histogram().items()) == stats.new_tokens - 1
    assert sum(stats.histogram().values()) == stats.cycles
    assert stats.position_acceptance() == [n / stats.cycles for n in stats.accepted_at_position]


def test_record_cycle_counts_only_what_was_committed():
    stats = RowStats(block_size=BLOCK)
    stats.record_cycle(verified=3, committed=4, accepted=3)   # a whole block
    stats.record_cycle(verified=3, committed=1, accepted=1)   # cut to one token: one accepted draft
    stats.record_cycle(verified=0, committed=1, accepted=0)   # a plain step: in neither
    assert stats.histogram() == {1: 1, 2: 0, 3: 0, 4: 1} and stats.accepted_at_position == [2, 1, 1]
    assert (stats.cycles, stats.plain_steps) == (2, 1)
