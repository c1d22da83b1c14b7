"""What `dflash2 bench` measures against the float32 target: the lossless audit and the reference row.

Contract:
- `audit_runs(runs, proposers, concurrency, repeats, reference, dtype)` -> {proposer: {dataset or
  OVERALL: {c: Audit}}}: every greedy pair (plain decoding's output, the proposer's, same prompt,
  same batch size) of a bench run through `eval.audit.audit` (a divergence is examined once, however
  many repeats or proposers share it). The turn-t sides of a `DatasetRun` decode its turn-t prompts
  `repeats` times over, in order, so output j of a side answers that turn's prompt j mod n.
- `annotate(report, audits)`: adds `near_ties`, `defects`, `worst_margin` and `near_tie_bound` to
  each entry of one proposer's report (per dataset and overall, at every concurrency) beside its
  `mismatches`.
- `plain_row(model, prompts, plain_outputs, config, stop_ids)`: dflash2's plain decoding of the float32
  target at batch 1 over each dataset's prompts, in the peers' report format (`eval.peers.summarize`:
  tokens/s, and the sequences that differ from the benchmarked precision's plain decoding): the
  reference row a reduced-precision run keeps, so its speedups over plain decoding at its own
  precision can be read against the float32 decoder too.
"""
from __future__ import annotations

import time

from dflash2.decoding.loop.engine import SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.eval.audit import Audit, Reference, audit
from dflash2.eval.bench_runs import DatasetRun
from dflash2.eval.peers import summarize

OVERALL = "__overall__"


def _pairs(run: DatasetRun, proposer: str, c: int, repeats: int):
    pair, offset = run.runs[proposer][c], 0
    for ar_side, spec_side in zip(pair.ar, pair.spec):
        n = len(ar_side.outputs) // max(repeats, 1)
        turn = run.prompts[offset:offset + n]
        for j, (plain, other) in enumerate(zip(ar_side.outputs, spec_side.outputs)):
            yield turn[j % n], plain, other
        offset += n


def audit_runs(runs: dict[str, DatasetRun], proposers, concurrency, repeats: int, reference, dtype: str) -> dict:
    seen: dict[tuple, Audit] = {}

    def one(prompt, plain, other) -> Audit:
        key = (tuple(prompt), tuple(plain), tuple(other))
        if key not in seen:
            seen[key] = audit([(prompt, plain, other)], reference, dtype)
        return seen[key]

    out = {}
    for p in proposers:
        by_name = {}
        for name, run in runs.items():
            by_name[name] = {c: Audit.merged([one(*x) for x in _pairs(run, p, c, repeats)], dtype) for c in concurrency}
        by_name[OVERALL] = {c: Audit.merged([by_name[name][c] for name in runs], dtype) for c in concurrency}
        out[p] = by_name
    return out


def _fields(found: Audit) -> dict:
    return {"near_ties": found.near_ties, "defects": found.defects, "worst_margin": found.worst_margin,
            "near_tie_bound": found.bound}


def annotate(report: dict, audits: dict) -> None:
    for name, entry in list(report["datasets"].items()) + [(OVERALL, report["overall"])]:
        for c, found in audits[name].items():
            entry["by_concurrency"][str(c)].update(_fields(found))
        entry.update(_fields(audits[name][next(iter(audits[name]))]))


def plain_row(model, prompts: dict[str, list[list[int]]], plain_outputs: dict[str, list[list[int]]] | None,
              config, stop_ids) -> dict:
    decoder = SpeculativeDecoder(TargetAdapter(model))
    config = type(config)(**{**config.__dict__, "stop_token_ids": tuple(stop_ids)})
    report = {"status": "ok", "description": "dflash2 plain decoding of the float32 target, batch 1 (the float32 "
              "reference)", "notes": [], "datasets": {}, "overall": None}
    first = next((ids[0] for ids in prompts.values() if ids), None)
    if first is not None:   # untimed warm-up: first-call costs count in no row
        decoder.generate([first], type(config)(**{**config.__dict__, "max_new_tokens": min(8, config.max_new_tokens)}))
    everything, refs = [], []
    for name, ids in prompts.items():
        rows = []
        for prompt in ids:
            start = time.perf_counter()
            result = decoder.generate([prompt], config)[0]
            rows.append({"tokens": result.tokens, "seconds": time.perf_counter() - start})
        ref = plain_outputs[name] if plain_outputs else None
        report["datasets"][name] = summarize(rows, ref)
        everything += rows
        refs += ref or []
    report["overall"] = summarize(everything, refs if plain_outputs else None)
    report["notes"].append("mismatches here: sequences whose float32 plain output differs from plain decoding at the "
                           "benchmarked precision (different precisions: not a lossless check)")
    return report


def reference_model(reference) -> object:
    """The float32 model behind an `audit.reference_loader` callable."""
    loaded: Reference = reference()
    return loaded.model

