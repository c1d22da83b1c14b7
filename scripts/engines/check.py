"""Proof in real engines: the exports of the shipped draft run in vLLM (CPU), MLX `dflash` and
llama.cpp, compared token for token and cycle for cycle with this project's engine.

Run by scripts/engines_check.sh with the project's venv (the engines run in their own venvs through
the runners in scripts/engines/runners). Writes OUT/results.json and OUT/results.md.

    python scripts/engines/check.py [--out runs/engines] [--prompts 3] [--max-new-tokens 48]
                                    [--llama-types f32,bf16,q4_1] [--skip vllm,mlx,llama]

What it checks, all greedy, batch 1, fp32 target (the built-in smollm2, converted HF directory):
- vLLM CPU + the `dflash-v1` export vs dflash2 with the same (re-loaded) v1 export: identical
  tokens and identical per-cycle acceptance lengths; vLLM alone vs dflash2 autoregressive.
- MLX + `dflash` + the `dflash2` export vs dflash2 with the same export: tokens and cycles; MLX's
  target alone vs dflash2 autoregressive (where they part, the HF target's top-2 logit gap there).
- llama.cpp `llama-speculative-simple --spec-type draft-dflash --spec-draft-n-max 7` + the `gguf`
  export (F32) against GGUFs of the target: f32 (the target's GGUF dequantised: the very weights
  dflash2 runs) must give dflash2's per-cycle acceptance and output prompt by prompt; bf16 (the
  same, matrices rounded to bfloat16) is compared with dflash2 in bfloat16, q4_1 (the target's own
  file, other weights) with dflash2 in float32.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.eval import acceptance_arms as arms
from dflash2.eval.acceptance import same_text
from dflash2.eval import engine_peers
from dflash2.export import ExportSettings, export_draft
from dflash2.export import llama_cpp
from dflash2.export.acceptance_cost import classical_decoder, measurement_prompts
from dflash2.model.draft import DFlash2DraftModel
from dflash2.pipeline import load_decoder, shipped_draft_path
from dflash2.targets.builtin import BUILTIN_TARGETS, resolve_target

ROOT = Path(__file__).resolve().parents[2]


def log(message: str) -> None:
    print(f"[engines] {message}", file=sys.stderr, flush=True)


def ours(pipe, draft_dir: Path | None, prompts, max_new: int, target=None) -> list[dict]:
    log(f"  dflash2 with draft {draft_dir}")
    target = target or pipe.decoder.target
    dtype = target.model.dtype
    draft = DFlash2DraftModel.from_pretrained(draft_dir, dtype=dtype) if draft_dir else None
    decoder = classical_decoder(target, draft)
    config = GenerationConfig(max_new_tokens=max_new, stop_token_ids=tuple(pipe.stop_token_ids))
    rows = []
    for ids in prompts:
        start = time.perf_counter()
        [result] = decoder.generate([ids], config)
        cycles = result.stats.committed_per_cycle if draft is not None else [1] * max(len(result.tokens) - 1, 0)
        rows.append({"tokens": result.tokens, "acceptance_lengths": list(cycles),
                     "seconds": time.perf_counter() - start})
    return rows


def engine(short: str, target_dir: str, draft: Path | None, prompts, max_new: int, stops) -> dict:
    spec = next(p for p in engine_peers.ENGINE_PEERS if p.short == short)
    python = engine_peers.engine_python(spec)
    if python is None:
        return {"ok": False, "error": f"{spec.venv}/bin/python missing (run scripts/engines_check.sh, which creates it)"}
    request = {"target": target_dir, "draft": str(draft) if draft else None, "num_speculative_tokens": 7,
               "threads": torch.get_num_threads(),
               "max_new_tokens": max_new, "stop_token_ids": list(stops), "prompts": {"check": prompts}}
    return engine_peers.run_runner(spec, python, request)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(name: str, ref: list[dict], other: dict, cycles: bool) -> dict:
    if not other.get("ok"):
        return {"pair": name, "status": "failed", "error": other.get("error")}
    runs = other["datasets"]["check"]
    same_tokens = [r["tokens"] == o["tokens"] for r, o in zip(ref, runs)]
    out = {"pair": name, "status": "ok", "versions": other.get("versions"), "sequences": len(ref),
           "identical_tokens": sum(same_tokens),
           "first_difference": [first_difference(r["tokens"], o["tokens"]) for r, o in zip(ref, runs)],
           "tokens": sum(len(o["tokens"]) for o in runs), "seconds": sum(o["seconds"] for o in runs)}
    if cycles:
        out["identical_cycles"] = sum(r["acceptance_lengths"] == o["acceptance_lengths"] for r, o in zip(ref, runs))
        passes = sum(len(o["acceptance_lengths"]) for o in runs)
        out["acceptance_length"] = sum(sum(o["acceptance_lengths"]) for o in runs) / passes if passes else None
        ref_passes = sum(len(r["acceptance_lengths"]) for r in ref)
        out["dflash2_acceptance_length"] = sum(sum(r["acceptance_lengths"]) for r in ref) / ref_passes
        out["cycles"] = [o["acceptance_lengths"] for o in runs]
        out["dflash2_cycles"] = [r["acceptance_lengths"] for r in ref]
    return out


def logit_gap(pipe, ids: list[int], prefix: list[int]) -> dict:
    """The HF target's top-2 at the position where another engine's target chose differently."""
    model = pipe.decoder.target.model
    with torch.inference_mode():
        logits = model(torch.tensor([ids + prefix])).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return {"position": len(prefix), "top2_tokens": top.indices.tolist(),
            "top2_gap": float(top.values[0] - top.values[1])}


def llama_cpp_checks(pipe, prompts, shipped: Path, scratch: Path, max_new: int, kinds: list[str],
                     threads: int) -> list[dict]:
    """llama.cpp with the GGUF export against a GGUF of the target per kind (f32 / bf16: the target's
    GGUF dequantised, the weights dflash2 runs; q4_1: the target's own file), per-cycle acceptance
    and output compared with dflash2 at the matching precision (`reference`)."""
    lc = llama_cpp.find_llama_cpp()
    job = arms.Job(shipped, resolve_target("smollm2"), BUILTIN_TARGETS["smollm2"].locate_gguf(scratch), prompts,
                   [pipe.tokenizer.decode(ids) for ids in prompts], max_new, tuple(pipe.stop_token_ids), scratch)
    block = pipe.decoder.draft.config.block_size
    reference = {dtype: arms.dflash2_arm(job, dtype).runs for dtype in
                 sorted({"bfloat16" if kind == "bf16" else "float32" for kind in kinds})}
    out = []
    for kind in kinds:
        arm = arms.llama_cpp_arm(job, lc, kind, block, threads)
        ref_key = "bfloat16" if kind == "bf16" else "float32"
        row = {"pair": f"llama.cpp {kind} target GGUF + gguf export vs dflash2 {ref_key} + the shipped draft",
               "status": arm.status, "error": arm.reason or None, "versions": arm.versions, "notes": arm.notes}
        if arm.status == "ok":
            ref = reference[ref_key]
            row.update(sequences=len(ref),
                       identical_cycles=sum(a["committed"] == r["committed"] for a, r in zip(arm.runs, ref)),
                       identical_text=sum(same_text(a["text"], r["tokens"], pipe.tokenizer) for a, r in zip(arm.runs, ref)),
                       accepted=[a["n_accept"] for a in arm.runs], drafted=[a["n_drafted"] for a in arm.runs],
                       dflash2_accepted=[sum(c - 1 for c in r["committed"]) for r in ref],
                       cycles=[a["committed"] for a in arm.runs], dflash2_cycles=[r["committed"] for r in ref])
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "runs" / "engines"))
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--llama-types", default="f32,bf16,q4_1", help="target GGUFs llama.cpp runs (f32 / bf16: the "
                   "target's GGUF dequantised; q4_1: its own)")
    p.add_argument("--llama-threads", type=int, default=1)
    p.add_argument("--skip", default="", help="comma list of vllm, mlx, llama")
    p.add_argument("--threads", type=int, default=1, help="torch threads of this engine (1 is steadiest on a "
                   "shared 2-core machine)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shipped = shipped_draft_path("smollm2")
    exports = {}
    for form in ("dflash2", "dflash-v1", "gguf"):
        log(f"exporting the shipped draft as {form}")
        result = export_draft(ExportSettings(draft=shipped, form=form, out=out / "exports" / form, force=True,
                                             dtype="float32", measure_prompts=0))
        exports[form] = out / "exports" / form
        log(f"  {result.architecture}, {result.tensors} tensors")
    pipe = load_decoder("smollm2", str(shipped), dtype="float32", draft_dtype="float32")
    target_dir = str(resolve_target("smollm2"))
    prompts = measurement_prompts(pipe.tokenizer, args.prompts)
    stops, max_new = pipe.stop_token_ids, args.max_new_tokens
    log("dflash2: autoregressive, v1 export, DFlash2 export, shipped draft")
    base = {"ar": ours(pipe, None, prompts, max_new), "v1": ours(pipe, exports["dflash-v1"], prompts, max_new),
            "dflash2": ours(pipe, exports["dflash2"], prompts, max_new), "shipped": ours(pipe, shipped, prompts, max_new)}
    results = {"settings": {"prompts": len(prompts), "max_new_tokens": max_new, "target": "smollm2 (fp32 HF dir)",
                            "draft": "shipped smollm2-dflash2, exported in float32", "torch": torch.__version__},
               "dflash2_self": {
                   "dflash2_export_same_tokens_and_cycles_as_shipped": [
                       a["tokens"] == b["tokens"] and a["acceptance_lengths"] == b["acceptance_lengths"]
                       for a, b in zip(base["dflash2"], base["shipped"])],
                   "v1_export_same_tokens_as_autoregressive": [a["tokens"] == b["tokens"]
                                                               for a, b in zip(base["v1"], base["ar"])],
                   "acceptance_length": {k: sum(sum(r["acceptance_lengths"]) for r in v) /
                                         max(1, sum(len(r["acceptance_lengths"]) for r in v))
                                         for k, v in base.items() if k != "ar"}},
               "pairs": []}
    if "vllm" not in skip:
        log("vLLM CPU: target alone, then with the dflash-v1 export")
        results["pairs"].append(compare("vllm (target alone) vs dflash2 autoregressive", base["ar"],
                                        engine("vllm", target_dir, None, prompts, max_new, stops),
                                        cycles=False))
        results["pairs"].append(compare("vllm + dflash-v1 export vs dflash2 + same v1 export", base["v1"],
                                        engine("vllm-dflash", target_dir, exports["dflash-v1"],
                                               prompts, max_new, stops), cycles=True))
    if "mlx" not in skip:
        log("MLX: target alone, then dflash with the DFlash2 export")
        mlx_ar = engine("mlx-dflash", target_dir, None, prompts, max_new, stops)
        pair = compare("mlx (target alone) vs dflash2 autoregressive", base["ar"], mlx_ar, cycles=False)
        if mlx_ar.get("ok"):
            pair["hf_top2_where_mlx_departs"] = [
                logit_gap(pipe, ids, ref["tokens"][:i]) for ids, ref, i in zip(prompts, base["ar"], pair["first_difference"])
                if i is not None and i < len(ref["tokens"])]
        results["pairs"].append(pair)
        mlx_d2 = engine("mlx-dflash", target_dir, exports["dflash2"], prompts, max_new, stops)
        results["pairs"].append(compare("mlx dflash + dflash2 export vs dflash2 + same export", base["dflash2"],
                                        mlx_d2, cycles=True))
        if mlx_ar.get("ok") and mlx_d2.get("ok"):
            results["pairs"].append(compare("mlx dflash + dflash2 export vs mlx target alone (lossless in MLX)",
                                            mlx_ar["datasets"]["check"], mlx_d2, cycles=False))
    if "llama" not in skip:
        log("llama.cpp: GGUF export against f32 / bf16 GGUFs of the same weights and the target's own Q4_1")
        with tempfile.TemporaryDirectory(dir=out) as scratch:
            results["llama_cpp"] = llama_cpp_checks(pipe, prompts, shipped, Path(scratch), max_new,
                                                    args.llama_types.split(","), args.llama_threads)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {out / 'results.json'}")
    print(json.dumps({k: v for k, v in results.items() if k != "pairs"}, indent=1))
    for pair in results["pairs"]:
        print(json.dumps({k: v for k, v in pair.items() if k not in ("cycles", "dflash2_cycles")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
