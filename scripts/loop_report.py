"""Repetition figures of a saved bench run, from its parts: how much each dataset's answers repeat
themselves, and each proposer's speedup on the answers that do not loop (batch 1).

Usage: PYTHONPATH=src python scripts/loop_report.py docs/bench/full-fp32-t0 [--concurrency 1]

Reads OUTPUT/parts/dataset-*.json of `dflash2 bench` (also runs made before bench reported these
figures itself: their batches are rebuilt from the batch size, prompts in order) and prints, per
dataset and pooled, the mean repeated 4-gram share of the answers, the looping answers, and per
proposer the speedup over all batches and over the batches with no looping answer
(`dflash2.eval.repetition`, `eval.bench_runs.entry`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash2.eval.bench_runs import DatasetRun, PairRuns, entry


def with_rows(pair: PairRuns, batch: int) -> PairRuns:
    """Sides saved without `batch_rows`: each turn's prompts were decoded `batch` at a time, in order."""
    for side in pair.ar + pair.spec:
        if not side.batch_rows:
            n = len(side.outputs)
            side.batch_rows = [min(batch, n - start) for start in range(0, n, batch)]
            assert len(side.batch_rows) == len(side.batches), "batch size does not match the saved batches"
    return pair


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run", help="a bench --output directory")
    p.add_argument("--concurrency", type=int, default=1)
    args = p.parse_args()
    c = args.concurrency
    pooled: dict[str, PairRuns] = {}
    rows = []
    for path in sorted(Path(args.run, "parts").glob("dataset-*.json")):
        run = DatasetRun.from_dict(json.loads(path.read_text())["payload"])
        name = path.stem.removeprefix("dataset-")
        for proposer, by_c in run.runs.items():
            pair = with_rows(by_c[c], c)
            pooled.setdefault(proposer, PairRuns()).extend(pair)
            rows.append((name, proposer, entry(pair, 8, True)))
    rows += [("overall", proposer, entry(pair, 8, True)) for proposer, pair in pooled.items()]
    print(f"| dataset | proposer | repeated 4-grams | looping answers | speedup | speedup, no loops |\n|---|---|---:|---:|---:|---:|")
    for name, proposer, d in rows:
        rep = d["repetition"]
        nl = d["speedup_non_looping"]
        print(f"| {name} | {proposer} | {100 * rep['mean_share']:.0f} % | {rep['looping']} / {rep['answers']} | "
              f"{d['speedup']:.2f} | {'–' if nl is None else f'{nl:.2f}'} |")


if __name__ == "__main__":
    main()
