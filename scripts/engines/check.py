"""Proof in real engines: the exports of the shipped draft run in vLLM (CPU), MLX `dflash` and
llama.cpp, compared token for token and cycle for cycle with this project's engine.

Run by scripts/engines_check.sh with the project's venv (the engines run in their own venvs through
the runners in scripts/engines/runners). Writes OUT/results.json and OUT/results.md.

    python scripts/engines/check.py [--out runs/engines] [--prompts 4] [--max-new-tokens 64]
                                    [--llama-prompts 2] [--skip vllm,mlx,llama]

What it checks, all greedy, batch 1, fp32 target (the built-in smollm2, converted HF directory):
- vLLM CPU + the `dflash-v1` export vs dflash2 with the same (re-loaded) v1 export: identical
  tokens and identical per-cycle acceptance lengths; vLLM alone vs dflash2 autoregressive.
- MLX + `dflash` + the `dflash2` export vs dflash2 with the same export: tokens and cycles; MLX's
  target alone vs dflash2 autoregressive (where they part, the HF target's top-2 logit gap there).
- llama.cpp `llama-speculative-simple --spec-type draft-dflash` + the `gguf` export against the
  target's own GGUF (Q4_1): it loads and accepts (drafted / accepted counts).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.eval import engine_peers
from dflash2.export import ExportSettings, export_draft
from dflash2.export.acceptance_cost import classical_decoder, measurement_prompts
from dflash2.model.draft import DFlash2DraftModel
from dflash2.pipeline import load_decoder, shipped_draft_path
from dflash2.targets.builtin import BUILTIN_TARGETS, resolve_target

ROOT = Path(__file__).resolve().parents[2]
LLAMA_BIN = ROOT / ".engines" / "llama.cpp" / "build" / "bin" / "llama-speculative-simple"


def log(message: str) -> None:
    print(f"[engines] {message}", file=sys.stderr, flush=True)


def ours(pipe, draft_dir: Path | None, prompts, max_new: int) -> list[dict]:
    log(f"  dflash2 with draft {draft_dir}")
    draft = DFlash2DraftModel.from_pretrained(draft_dir, dtype=torch.float32) if draft_dir else None
    decoder = classical_decoder(pipe.decoder.target, draft)
    config = GenerationConfig(max_new_tokens=max_new, stop_token_ids=tuple(pipe.stop_token_ids))
    rows = []
    for ids in prompts:
        start = time.perf_counter()
        [result] = decoder.generate([ids], config)
        cycles = result.stats.committed_per_cycle if draft is not None else [1] * max(len(result.tokens) - 1, 0)
        rows.append({"tokens": result.tokens, "acceptance_lengths": list(cycles),
                     "seconds": time.perf_counter() - start})
    return rows


def engine(runner: str, venv: str, target_dir: str, draft: Path | None, prompts, max_new: int, stops) -> dict:
    python = ROOT / venv / "bin" / "python"
    if not python.is_file():
        return {"ok": False, "error": f"{python} missing (run scripts/engines_check.sh, which creates it)"}
    request = {"target": target_dir, "draft": str(draft) if draft else None, "num_speculative_tokens": 7,
               "threads": torch.get_num_threads(),
               "max_new_tokens": max_new, "stop_token_ids": list(stops), "prompts": {"check": prompts}}
    with tempfile.TemporaryDirectory(prefix="dflash2-engines-") as tmp:
        result = Path(tmp) / "result.json"
        script = engine_peers.RUNNERS / runner
        proc = subprocess.run([str(python), str(script), str(result)], input=json.dumps(request), text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not result.is_file():
            return {"ok": False, "error": f"runner exited {proc.returncode}: {proc.stderr.strip()[-600:]}"}
        return json.loads(result.read_text())


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


def llama_cpp(target_gguf: Path, draft_gguf: Path, text_prompts: list[str], max_new: int) -> dict:
    if not LLAMA_BIN.is_file():
        return {"ok": False, "error": f"{LLAMA_BIN} missing (scripts/engines/build_llama_cpp.sh)"}
    version = subprocess.run([str(LLAMA_BIN), "--version"], capture_output=True, text=True)
    runs = []
    for text in text_prompts:
        cmd = [str(LLAMA_BIN), "-m", str(target_gguf), "-md", str(draft_gguf), "--spec-type", "draft-dflash",
               "--spec-draft-n-max", "7", "-p", text, "-n", str(max_new), "--temp", "0", "--top-k", "1",
               "--seed", "42", "-t", "2", "-c", "4096"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log_text = proc.stdout + proc.stderr
        stats = {key: int(m.group(1)) for key in ("n_predict", "n_drafted", "n_accept")
                 for m in [re.search(rf"{key}\s*=\s*(\d+)", log_text)] if m}
        speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log_text)
        runs.append({"returncode": proc.returncode, **stats,
                     "decode_seconds": float(speed.group(2)) if speed else None,
                     "loaded_dflash2": "DFlash2 conv kernel" in log_text,
                     "error": None if proc.returncode == 0 else log_text.strip().splitlines()[-1][:400]})
    ok = all(r["returncode"] == 0 and "n_drafted" in r for r in runs)
    return {"ok": ok, "runs": runs, "version": (version.stdout + version.stderr).strip().splitlines()[-2:],
            "command": "llama-speculative-simple -m TARGET.gguf -md draft.gguf --spec-type draft-dflash "
                       "--spec-draft-n-max 7 -p PROMPT -n N --temp 0 --top-k 1 -t 2"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "runs" / "engines"))
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--llama-prompts", type=int, default=1)
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
    pipe = load_decoder("smollm2", str(shipped), draft_dtype="float32")
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
                                        engine("vllm_runner.py", ".venv-vllm", target_dir, None, prompts, max_new, stops),
                                        cycles=False))
        results["pairs"].append(compare("vllm + dflash-v1 export vs dflash2 + same v1 export", base["v1"],
                                        engine("vllm_runner.py", ".venv-vllm", target_dir, exports["dflash-v1"],
                                               prompts, max_new, stops), cycles=True))
    if "mlx" not in skip:
        log("MLX: target alone, then dflash with the DFlash2 export")
        mlx_ar = engine("mlx_runner.py", ".venv-mlx", target_dir, None, prompts, max_new, stops)
        pair = compare("mlx (target alone) vs dflash2 autoregressive", base["ar"], mlx_ar, cycles=False)
        if mlx_ar.get("ok"):
            pair["hf_top2_where_mlx_departs"] = [
                logit_gap(pipe, ids, ref["tokens"][:i]) for ids, ref, i in zip(prompts, base["ar"], pair["first_difference"])
                if i is not None and i < len(ref["tokens"])]
        results["pairs"].append(pair)
        mlx_d2 = engine("mlx_runner.py", ".venv-mlx", target_dir, exports["dflash2"], prompts, max_new, stops)
        results["pairs"].append(compare("mlx dflash + dflash2 export vs dflash2 + same export", base["dflash2"],
                                        mlx_d2, cycles=True))
        if mlx_ar.get("ok") and mlx_d2.get("ok"):
            results["pairs"].append(compare("mlx dflash + dflash2 export vs mlx target alone (lossless in MLX)",
                                            mlx_ar["datasets"]["check"], mlx_d2, cycles=False))
    if "llama" not in skip:
        log("llama.cpp: GGUF export against the target's own GGUF")
        texts = [pipe.tokenizer.decode(ids) for ids in prompts[:args.llama_prompts]]
        with tempfile.TemporaryDirectory() as scratch:
            target_gguf = BUILTIN_TARGETS["smollm2"].locate_gguf(Path(scratch))
            results["llama_cpp"] = llama_cpp(target_gguf, exports["gguf"] / "draft.gguf", texts, max_new)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {out / 'results.json'}")
    print(json.dumps({k: v for k, v in results.items() if k != "pairs"}, indent=1))
    for pair in results["pairs"]:
        print(json.dumps({k: v for k, v in pair.items() if k not in ("cycles", "dflash2_cycles")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
