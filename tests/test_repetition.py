"""The repetition measure of bench reports: repeated 4-gram share, looping answers, and the speedup
on the batches whose answers do not loop."""
from __future__ import annotations

import pytest

from dflash2.decoding.loop.stats import BatchTiming, RowStats
from dflash2.eval.bench_report import render_markdown
from dflash2.eval.bench_runs import PairRuns, Side, entry, non_looping_speedup
from dflash2.eval.repetition import LOOP_THRESHOLD, RepetitionSummary, loops, repeated_ngram_share

FRESH = list(range(100, 140))                  # 40 distinct tokens: no 4-gram repeats
LOOP = [7, 8, 9, 10, 11] * 8                   # a 5-token cycle said 8 times


def test_repeated_share_counts_ngrams_seen_earlier_in_the_same_answer():
    assert repeated_ngram_share([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)   # (1,2,3,4) again, of 5 4-grams
    assert repeated_ngram_share(FRESH) == 0.0
    assert repeated_ngram_share(LOOP) == pytest.approx(32 / 37)        # every 4-gram after the first cycle repeats
    assert repeated_ngram_share([5, 5, 5]) == 0.0                       # shorter than a 4-gram
    assert repeated_ngram_share([5, 5, 5, 5, 5]) == pytest.approx(1 / 2)
    assert repeated_ngram_share([1, 2, 1, 2, 1], n=2) == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        repeated_ngram_share([1, 2], n=0)


def test_an_answer_loops_above_the_threshold_only():
    assert not loops(FRESH) and loops(LOOP)
    # 30 fresh tokens then one 4-gram said again: 1 of 31 4-grams, far below the threshold
    assert not loops(FRESH[:30] + FRESH[:4])
    summary = RepetitionSummary.of([FRESH, LOOP, FRESH])
    assert summary.looping == 1 and summary.answers == 3 and summary.threshold == LOOP_THRESHOLD
    assert summary.mean_share == pytest.approx((32 / 37) / 3)
    assert RepetitionSummary.of([]).mean_share is None


def side(answers_per_batch, decoding_seconds, prefill=0.5):
    s = Side()
    for answers, seconds in zip(answers_per_batch, decoding_seconds):
        tokens = sum(len(a) for a in answers)
        s.outputs += answers
        s.stats += [RowStats(8, new_tokens=len(a)) for a in answers]
        s.batches.append(BatchTiming(prefill_seconds=prefill, total_seconds=prefill + seconds))
        s.batch_seconds.append(prefill + seconds)
        s.batch_tokens.append(tokens)
        s.batch_rows.append(len(answers))
        s.seconds += prefill + seconds
    return s


def test_speedup_without_loops_pools_only_the_batches_with_no_looping_answer():
    # batch 1: a looping answer, the speculative decoder 4x faster; batch 2 (two fresh answers): 1.25x
    batches = [[LOOP], [FRESH, FRESH]]
    ar = side(batches, [4.0, 5.0])
    spec = side(batches, [1.0, 4.0])
    assert non_looping_speedup([ar], [spec]) == pytest.approx(5.0 / 4.0)
    report = entry(PairRuns([ar], [spec]), block=8, greedy=True)
    assert report["speedup"] == pytest.approx(9.0 / 5.0)               # pooled over both batches
    assert report["speedup_non_looping"] == pytest.approx(5.0 / 4.0)
    assert report["repetition"]["looping"] == 1 and report["repetition"]["answers"] == 3
    assert non_looping_speedup([side([[LOOP]], [2.0])], [side([[LOOP]], [1.0])]) is None   # every batch loops
    assert non_looping_speedup([], [spec]) is None                                          # no baseline


def test_side_round_trips_its_batch_rows():
    s = side([[FRESH], [FRESH, LOOP]], [1.0, 2.0])
    again = Side.from_dict(s.to_dict())
    assert again.batch_rows == [1, 2] and again.batch_answers() == [[FRESH], [FRESH, LOOP]]


def test_report_shows_repetition_beside_the_speedups():
    report = entry(PairRuns([side([[FRESH], [LOOP]], [2.0, 2.0])], [side([[FRESH], [LOOP]], [1.0, 1.0])]), 8, True)
    report.update(by_concurrency={"1": dict(report)}, num_prompts=2, mean_over_datasets=report["acceptance_length"] or 0)
    results = {"settings": {"target": "t", "draft": "d", "trained_draft": True, "num_prompts": 2, "max_new_tokens": 40,
                            "temperature": 0.0, "top_p": 1.0, "top_k": 0, "block_size": 8, "device": "cpu",
                            "dtype": "float32", "seed": 0, "concurrency": [1], "datasets": ["mine"]},
               "datasets": {"mine": report}, "overall": report, "machine": "m", "commit": "c", "peers": {},
               "plots": []}
    markdown = render_markdown(results)
    assert "repeated 4-grams" in markdown and "speedup, no loops" in markdown
    assert "| 43 % | 1 / 2 |" in markdown                  # mean of 0 and 32/37, one of two answers loops
    assert f"exceeds {LOOP_THRESHOLD:g}" in markdown
