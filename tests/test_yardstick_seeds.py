"""The yardstick's T=1 over several sampled runs (`--t1-seeds`): every seed's run of each prompt is
pooled (committed tokens over cycles), T=0 runs once, and one seed is the single run it always was."""
from dataclasses import replace

import pytest

from dflash2.eval.yardstick import Prompt, YardstickSettings, measure
from dflash2.pipeline import tiny_pipeline

PROMPTS = [Prompt("a", [5, 9, 14, 3, 7, 22]), Prompt("a", [11, 4, 8]), Prompt("b", [30, 2, 17, 6])]


def test_t1_seeds_pool_the_runs_of_each_seed():
    pipe = tiny_pipeline(seed=0, speculate="always")
    settings = YardstickSettings(data_dirs=(), max_new_tokens=16, batch_size=1)   # one row a batch: its cycles are the rows'
    single = [measure(pipe, replace(settings, seed=seed), PROMPTS) for seed in (0, 1, 2)]
    pooled = measure(pipe, replace(settings, t1_seeds=3), PROMPTS)

    assert pooled.tau["t0"] == single[0].tau["t0"]      # T=0 runs once (greedy: the seed does not matter)
    assert {r.tau["t0"] for r in single} == {single[0].tau["t0"]}
    t0_cycles, rest = divmod(sum(r.cycles for r in single) - pooled.cycles, 2)   # 3 runs' T=0 less the pooled one's
    assert rest == 0 and t0_cycles > 0
    t1_cycles = [r.cycles - t0_cycles for r in single]
    assert len({(r.tau["t1"], n) for r, n in zip(single, t1_cycles)}) > 1        # the seeds sample differently
    expected = sum(r.tau["t1"] * n for r, n in zip(single, t1_cycles)) / sum(t1_cycles)
    assert pooled.tau["t1"] == pytest.approx(expected, rel=1e-9)
