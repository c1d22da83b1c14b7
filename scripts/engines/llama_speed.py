"""llama.cpp's speed with and without the shipped draft, per target GGUF type, and the check that the
advice `dflash2 export --to gguf` prints names the fastest measured setting.

    python scripts/engines/llama_speed.py [--out runs/llama-speed] [--types q4_1,bf16,f32] [--prompts 3]
        [--new-tokens 64] [--rounds 3] [--repetitions 10] [--threads 2] [--dflash2-prompts 4]

Per type (q4_1: the target's own GGUF; bf16 / f32: it dequantised, `export.gguf_target`):
- T(w) / T(1), w = 1..8: `llama-bench -p w -n 0 -b w -ub w -d 256 -r R -t T -o json` (medians);
- `llama-speculative-simple` greedy on `--prompts` benchmark prompts: plain (`--spec-type none`), the
  draft's GGUF export (`--draft-dtype`, float32 by default) at `--spec-draft-n-max` 1..7, and the n-gram modes (ngram-simple,
  ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache at n-max 7), interleaved, `--rounds` rounds,
  medians of each round's tokens/s; acceptance = accepted / drafted (llama.cpp's rate) and tokens
  per target pass;
- dflash2's own tokens/s on the same prompts (`--dflash2-rows`: float32, bfloat16 and bfloat16 with
  `--weights int4`, plain and the whole block every cycle, `--threads` torch threads), for comparison;
- the advice (`export.speculation_advice`) from these costs and dflash2's E(k) (float32 target and
  draft, `--dflash2-prompts` prompts, a block of k + 1 per n-max k), and whether its setting (or
  "do not speculate") is the fastest measured.
Writes OUT/results.json and OUT/table.md. Not part of the test run (minutes to hours on shared cores).
`--reanalyse RESULTS`: the advice and table again from a results.json's recorded measurements (no
engine runs; after a change to the advice's arithmetic), written beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from dflash2.export import ExportSettings, export_draft, llama_cpp
from dflash2.export.acceptance_cost import draft_runs, expected_tokens_by_width, measurement_prompts
from dflash2.export.gguf_target import unquantized_gguf
from dflash2.export.llama_cpp_advice import Timing, grid, measurements_from, setting_runs
from dflash2.export.speculation_advice import advise
from dflash2.pipeline import load_decoder, shipped_draft_path
from dflash2.targets.builtin import BUILTIN_TARGETS

NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
KINDS = {"q4_1": None, "bf16": "bfloat16", "f32": "float32"}
# dflash2's own rows: (label, --dtype, --weights); int4 is the Q4_1 GGUF's grid (model.quantized)
DFLASH2_ROWS = (("float32", "float32", "float"), ("bfloat16", "bfloat16", "float"), ("int4", "bfloat16", "int4"))


def log(message: str) -> None:
    print(f"[llama speed] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/llama-speed")
    p.add_argument("--types", default="q4_1,bf16,f32")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repetitions", type=int, default=10)
    p.add_argument("--depth", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dflash2-prompts", type=int, default=4)
    p.add_argument("--ngram", default=",".join(NGRAM_MODES), help="n-gram modes to time ('' for none)")
    p.add_argument("--draft-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the draft's GGUF matrices (its norms and vectors stay F32)")
    p.add_argument("--dflash2-rows", default=",".join(r[0] for r in DFLASH2_ROWS),
                   help="dflash2's own rows to time: " + ", ".join(r[0] for r in DFLASH2_ROWS))
    p.add_argument("--reanalyse", default=None, help="a results.json: its advice and table again, no runs")
    args = p.parse_args(argv)
    args.dflash2_rows = [r.strip() for r in args.dflash2_rows.split(",") if r.strip()]
    unknown = set(args.dflash2_rows) - {r[0] for r in DFLASH2_ROWS}
    if unknown:
        p.error(f"--dflash2-rows: unknown row(s) {', '.join(sorted(unknown))}")
    if args.reanalyse:
        return reanalyse(Path(args.reanalyse))
    lc = llama_cpp.find_llama_cpp()
    if lc is None:
        print(llama_cpp.INSTALL_HINT, file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    shipped = shipped_draft_path("smollm2")
    own = BUILTIN_TARGETS["smollm2"].locate_gguf(out)
    draft = out / ("draft-gguf" if args.draft_dtype == "float32" else f"draft-gguf-{args.draft_dtype}") / "draft.gguf"
    if not draft.is_file():
        export_draft(ExportSettings(draft=shipped, form="gguf", out=draft.parent, force=True, dtype=args.draft_dtype,
                                    measure_prompts=0))
    log("dflash2: E(k) per n-max k (float32, a block of k + 1)")
    pipe = load_decoder("smollm2", str(shipped), dtype="float32", draft_dtype="float32", proposer="draft")
    block = pipe.decoder.draft.config.block_size
    ids = measurement_prompts(pipe.tokenizer, args.dflash2_prompts)
    expected = expected_tokens_by_width(pipe.decoder.target, pipe.decoder.draft, ids, args.new_tokens,
                                        pipe.stop_token_ids, range(1, block))
    log(f"  E(k) = {expected}")
    prompt_ids = measurement_prompts(pipe.tokenizer, args.prompts)
    texts = [pipe.tokenizer.decode(x) for x in prompt_ids]
    del pipe
    results = {"settings": vars(args), "llama_cpp": lc.version(), "expected_dflash2": expected,
               "dflash2": dflash2_speed(shipped, prompt_ids, args), "types": {}}
    for kind in args.types.split(","):
        gguf = own if KINDS[kind] is None else out / f"target-{kind}.gguf"
        if not gguf.is_file():
            unquantized_gguf(own, gguf, KINDS[kind])
        log(f"{kind}: llama-bench widths 1..{block}")
        seconds = llama_cpp.verify_costs(lc, gguf, range(1, block + 1), args.depth, args.repetitions, args.threads)
        base = llama_cpp.Run(gguf, "", args.new_tokens, threads=args.threads)
        runs = setting_runs(base, draft, block - 1, [m for m in args.ngram.split(",") if m])
        log(f"{kind}: {len(runs)} settings x {len(texts)} prompts x {args.rounds} rounds")
        timings = grid(lc, runs, texts, args.rounds)
        entry = analysed(seconds, timings, expected, f"llama.cpp, target {gguf.name}, {args.threads} threads")
        entry["commands"] = {label: " ".join(llama_cpp.spec_args(run, lc.repack)) for label, run in runs.items()}
        results["types"][kind] = entry
        log("\n".join(entry["advice"]) + f"\n  fastest measured: {entry['fastest']}; advised: {entry['advised']}")
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "table.md").write_text(table(results) + "\n")
    print(table(results))
    return 0


def analysed(seconds: dict[int, float], timings: dict[str, Timing], expected: dict[int, float], where: str) -> dict:
    """One target type's measurements, advice, and whether the advice names the fastest of the settings
    it chooses between (plain and the draft's n-max; the n-gram modes are another choice)."""
    advice = advise(measurements_from(seconds, timings, expected, where))
    speed = {label: t.tokens_per_second for label, t in timings.items()}
    fastest = max((label for label in speed if label == "plain" or label.startswith("draft")), key=speed.get)
    advised = "plain" if advice.best is None else f"draft n-max {advice.best}"
    return {"verify_seconds": seconds, "timings": {k: asdict(v) for k, v in timings.items()}, "advice": advice.lines(),
            "advised": advised, "fastest": fastest, "fastest_of_all": max(speed, key=speed.get),
            "advice_is_fastest": advised == fastest}


def reanalyse(path: Path) -> int:
    results = json.loads(path.read_text())
    expected = {int(k): v for k, v in results["expected_dflash2"].items()}
    for kind, entry in results["types"].items():
        seconds = {int(w): s for w, s in entry["verify_seconds"].items()}
        timings = {label: Timing(**t) for label, t in entry["timings"].items()}
        entry.update(analysed(seconds, timings, expected, f"llama.cpp, target {kind}, {results['settings']['threads']} threads"))
    path.write_text(json.dumps(results, indent=2) + "\n")
    (path.parent / "table.md").write_text(table(results) + "\n")
    print(table(results))
    return 0


def dflash2_speed(shipped: Path, prompts: list[list[int]], args) -> dict:
    """dflash2's own tokens/s on the same prompts: plain and the draft's whole block every cycle, per
    precision, `--rounds` interleaved rounds (median); tau over the draft's cycles."""
    out = {}
    for row, dtype, weights in DFLASH2_ROWS:
        if row not in args.dflash2_rows:
            continue
        pipe = load_decoder("smollm2", str(shipped), dtype=dtype, draft_dtype=dtype, proposer="draft", weights=weights)
        speeds = {"plain": [], "draft": []}
        tau = None
        for _ in range(args.rounds):
            for label, draft in (("plain", None), ("draft", pipe.decoder.draft)):
                start = time.perf_counter()
                runs = draft_runs(pipe.decoder.target, draft, prompts, args.new_tokens, pipe.stop_token_ids)
                speeds[label].append(sum(len(r.tokens) for r in runs) / (time.perf_counter() - start))
                if draft is not None:
                    tau = sum(sum(r.stats.committed_per_cycle) for r in runs) / sum(r.stats.cycles for r in runs)
        out[row] = {"plain": statistics.median(speeds["plain"]), "draft": statistics.median(speeds["draft"]),
                    "tau": tau}
        log(f"dflash2 {row}: {out[row]}")
    return out


def table(results: dict) -> str:
    kinds = list(results["types"])
    labels = list(next(iter(results["types"].values()))["timings"])
    head = "| setting | " + " | ".join(f"{k} tok/s | {k} accepted / drafted (tokens per pass)" for k in kinds) + " |"
    lines = [head, "|---" * (1 + 2 * len(kinds)) + "|"]
    for label in labels:
        cells = []
        for kind in kinds:
            t = results["types"][kind]["timings"][label]
            rate = f"{t['accepted']} / {t['drafted']}" if t["drafted"] else "-"
            cells += [f"{t['tokens_per_second']:.0f}", f"{rate} ({t['tokens_per_pass']:.2f})"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for dtype, row in results["dflash2"].items():
        lines.append(f"| dflash2 {dtype} (plain / draft, tau) | {row['plain']:.0f} / {row['draft']:.0f} | "
                     f"tau {row['tau']:.2f} |" + " |" * (2 * len(kinds) - 2))
    lines.append("| advice | " + " | ".join(f"{results['types'][k]['advised']} "
                                             f"({'fastest' if results['types'][k]['advice_is_fastest'] else 'NOT fastest'} of plain and the draft)"
                                             " | " for k in kinds) + "|")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
