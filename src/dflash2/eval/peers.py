"""Peer decoders that `dflash2 bench --peers` runs on the same prompts as dflash2.

Contract: every peer returns a report `{"status": "ok" | "unavailable" | "failed", "description",
"reason"?, "notes", "datasets": {name: SUMMARY}, "overall": SUMMARY}` and never raises for a peer
that cannot run here: the reason goes into the results instead. SUMMARY has `tokens_per_second`,
`time_per_output_token_ms`, `new_tokens`, `acceptance_length` (None when not measurable),
`speedup` (over the peer's own autoregressive baseline, when it has one) and, at T=0,
`mismatches` against dflash2's autoregressive outputs for the same prompts.

- `hf_generate(model, prompts, ...)`: Hugging Face `generate()`, autoregressive, batch 1.
- `hf_prompt_lookup(...)`: `generate(prompt_lookup_num_tokens=B-1)`, batch 1 (the only batch size
  HF assisted decoding supports). Acceptance length = new tokens / target forward passes, counted
  with a forward hook (HF merges the prefill with the first verification, so that pass counts).
- `dflash_reference(...)`: PyPI `dflash` 0.1.0 run by `reference_runner.py` in the peers
  venv (default `.venv-peers`, made by `scripts/setup_peers.sh`; `--peers-python` or
  `$DFLASH2_PEERS_PYTHON` override), over a JSON file protocol, batch 1.
- serving engines (`vllm`, `vllm-dflash`, `mlx-dflash`): `dflash2.eval.engine_peers`, each in its
  own venv, same protocol; llama.cpp (`llama-cpp`, `llama-cpp-dflash`): `dflash2.eval.llama_peers`.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig as HFConfig

RUNNER = Path(__file__).resolve().parents[3] / "scripts" / "engines" / "runners" / "reference_runner.py"
PEER_NAMES = ("hf", "pld", "dflash")   # the peers run here; `engine_peers` adds the engines


def summarize(rows: list[dict], reference: list[list[int]] | None, baseline_tpot_ms: float | None = None) -> dict:
    """rows: {"tokens" (or only their count, "new_tokens"), "seconds", "passes"?} per prompt; reference:
    dflash2 AR outputs (T=0) or None (a peer that prints text counts its mismatches itself)."""
    tokens = sum(r["new_tokens"] if "new_tokens" in r else len(r["tokens"]) for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    passes = [r.get("passes") for r in rows]
    tpot = seconds / tokens if tokens else None
    out = {"new_tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds if seconds else None,
           "time_per_output_token_ms": 1000 * tpot if tpot else None,
           "acceptance_length": tokens / sum(passes) if passes and None not in passes and sum(passes) else None,
           "speedup": baseline_tpot_ms / (1000 * tpot) if baseline_tpot_ms and tpot else None}
    if reference is not None:
        out["mismatches"] = sum(r["tokens"] != ref for r, ref in zip(rows, reference))
    return out


def _report(status: str, description: str, **extra) -> dict:
    return {"status": status, "description": description, "notes": [], "datasets": {}, "overall": None, **extra}


def _hf_runs(model, prompts: list[list[int]], config, stop_ids, pad_id: int, lookup: int | None, desc: str):
    sampling = config.temperature > 0
    gen = HFConfig(max_new_tokens=config.max_new_tokens, do_sample=sampling, pad_token_id=pad_id,
                   eos_token_id=list(stop_ids) or None,
                   **({"temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k}
                      if sampling else {}),
                   **({"prompt_lookup_num_tokens": lookup} if lookup else {}))
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    rows = []
    try:
        for ids in tqdm(prompts, desc=desc, unit="prompt", leave=False):
            prompt = torch.tensor([ids], device=model.device)
            torch.manual_seed(config.seed)
            calls[0] = 0
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=gen)
            rows.append({"tokens": out[0, len(ids):].tolist(), "seconds": time.perf_counter() - start,
                         "passes": calls[0]})
    finally:
        hook.remove()
    return rows


def hf_peers(model, prompts: dict[str, list[list[int]]], ar_outputs: dict[str, list[list[int]]] | None,
             config, stop_ids, pad_id: int, block_size: int, which: set[str]) -> dict[str, dict]:
    """Hugging Face generate() (and prompt lookup) over each dataset's prompts."""
    reports = {}
    kinds = [("hf_generate", "hf", None, "Hugging Face generate(), autoregressive, batch 1"),
             ("hf_prompt_lookup", "pld", block_size - 1,
              f"Hugging Face generate(prompt_lookup_num_tokens={block_size - 1}), batch 1")]
    base_tpot: dict[str, float | None] = {}
    for key, short, lookup, description in kinds:
        if short not in which:
            continue
        report = _report("ok", description)
        try:
            everything, refs = [], []
            for name, ids in prompts.items():
                rows = _hf_runs(model, ids, config, stop_ids, pad_id, lookup, f"{key} {name}")
                ref = ar_outputs[name] if ar_outputs else None
                base = base_tpot.get(name)
                report["datasets"][name] = summarize(rows, ref, base)
                if short == "hf":
                    base_tpot[name] = report["datasets"][name]["time_per_output_token_ms"]
                everything += rows
                refs += ref or []
            base = base_tpot.get("__overall__")
            report["overall"] = summarize(everything, refs if ar_outputs else None, base)
            if short == "hf":
                base_tpot["__overall__"] = report["overall"]["time_per_output_token_ms"]
                report["notes"].append("acceptance length of an autoregressive decoder is 1 by definition")
            else:
                report["notes"].append("acceptance length = new tokens / target forward passes (forward hook); "
                                       "speedup is over Hugging Face generate() on the same prompts")
        except Exception as err:  # a peer's failure is reported, not fatal
            report = _report("failed", description, reason=" ".join(f"{type(err).__name__}: {err}".split())[:600])
        reports[key] = report
    return reports


def peers_python(explicit: str | None = None) -> Path | None:
    """The peers venv's python: `explicit`, else $DFLASH2_PEERS_PYTHON, else .venv-peers in the current
    directory or the source checkout. A path that was named but does not exist gives None."""
    named = explicit or os.environ.get("DFLASH2_PEERS_PYTHON")
    if named:
        return Path(named) if Path(named).is_file() else None
    for candidate in (Path.cwd() / ".venv-peers/bin/python", Path(__file__).resolve().parents[2] / ".venv-peers/bin/python"):
        if candidate.is_file():
            return candidate
    return None


def dflash_reference(python: str | None, target_dir: str | None, draft_dir: str | None,
                     prompts: dict[str, list[list[int]]], ar_outputs: dict[str, list[list[int]]] | None,
                     config, stop_ids, device: str, dtype: str, timeout: float = 6 * 3600) -> dict:
    """Run PyPI dflash 0.1.0 in its own venv on the same prompts and draft checkpoint."""
    description = "PyPI dflash 0.1.0 (reference implementation, transformers backend), batch 1"
    exe = peers_python(python)
    if exe is None:
        where = python or os.environ.get("DFLASH2_PEERS_PYTHON") or ".venv-peers/bin/python"
        return _report("unavailable", description, reason=f"peers venv not found ({where}); create it with "
                                                          "`bash scripts/setup_peers.sh` (see docs/benchmarking.md)")
    if not target_dir or not Path(target_dir).is_dir():
        return _report("unavailable", description, reason=f"target '{target_dir}' is not a local directory; the "
                                                          "reference loads it with local_files_only")
    request = {"target": str(target_dir), "draft": str(draft_dir), "device": device,
               "dtype": {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}.get(dtype, dtype),
               "max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "top_p": config.top_p,
               "top_k": config.top_k, "stop_token_ids": list(stop_ids), "seed": config.seed,
               "threads": torch.get_num_threads(), "prompts": prompts}
    with tempfile.TemporaryDirectory(prefix="dflash2-peer-") as tmp:
        result_file = Path(tmp) / "result.json"
        request["draft"], note = draft_for_reference(draft_dir, Path(tmp) / "draft")
        try:
            code, log_tail = _run_streaming([str(exe), str(RUNNER), str(result_file)], json.dumps(request), timeout)
        except OSError as err:
            return _report("unavailable", description, reason=f"cannot start {exe}: {err}")
        if code is None:
            return _report("failed", description, reason=f"timed out after {timeout:.0f} s")
        if not result_file.is_file():
            last = [line for line in log_tail if line.strip()][-1:] or ["no output"]
            return _report("failed", description, reason=f"runner exited {code}: {last[0][:400]}",
                           log_tail="\n".join(log_tail))
        result = json.loads(result_file.read_text())
    if not result.get("ok"):
        report = _report("failed", description, reason=result.get("error"), traceback=result.get("traceback"))
    else:
        report = _reference_report(result, description, ar_outputs)
    if note:
        report["notes"].insert(0, note)
    return report


def draft_for_reference(draft_dir: str, scratch: Path) -> tuple[str, str | None]:
    """The draft directory to hand to the reference loader, and a note if it had to be adapted.

    The package reads the draft's config through transformers' Qwen3Config, which keeps
    `sliding_window` only when `use_sliding_window` is true (published DFlash checkpoints set it);
    without it the window becomes None while `layer_types` still says sliding_attention, and the
    package's DynamicCache fails. A config that omits the flag gets it in a scratch copy (weights
    symlinked), so the same weights run with the window the draft was built for."""
    config = json.loads((Path(draft_dir) / "config.json").read_text())
    if "use_sliding_window" in config or not config.get("sliding_window"):
        return str(draft_dir), None
    scratch.mkdir(parents=True)
    for item in Path(draft_dir).iterdir():
        if item.name != "config.json":
            (scratch / item.name).symlink_to(item.resolve())
    (scratch / "config.json").write_text(json.dumps(dict(config, use_sliding_window=True), indent=2))
    return str(scratch), ("the draft's config.json has sliding_window but no use_sliding_window; the reference "
                          "(Qwen3Config) would drop the window and crash, so it loaded a copy with "
                          "use_sliding_window: true (same weights)")


def _run_streaming(command: list[str], stdin_text: str, timeout: float) -> tuple[int | None, list[str]]:
    """Run `command`, echo its stderr live, keep the last lines; exit code None on timeout."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()
    timer = threading.Timer(timeout, kill)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    try:
        proc.stdin.write(stdin_text)
        proc.stdin.close()
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))
        code = proc.wait()
    finally:
        timer.cancel()
    return (None if killed.is_set() else code), list(tail)


def _reference_report(result: dict, description: str, ar_outputs) -> dict:
    report = _report("ok", description, versions=result["versions"], load_info=result["load_info"])
    report["notes"] = list(result.get("notes", []))
    report["notes"].append("speedup is over the package's own block-size-1 run (its autoregressive baseline)")
    spec_all, ar_all, refs = [], [], []
    for name, rows in result["datasets"].items():
        spec = [{"tokens": r["spec"]["tokens"], "seconds": r["spec"]["seconds"],
                 "passes": len(r["spec"]["acceptance_lengths"]), "committed": sum(r["spec"]["acceptance_lengths"])}
                for r in rows]
        ar = [{"tokens": r["ar"]["tokens"], "seconds": r["ar"]["seconds"]} for r in rows]
        ref = ar_outputs[name] if ar_outputs else None
        report["datasets"][name] = _reference_summary(spec, ar, ref)
        report["datasets"][name]["per_sequence_cycles"] = [r["spec"]["acceptance_lengths"] for r in rows]
        report["datasets"][name]["acceptance_lengths_per_cycle"] = [a for r in rows for a in r["spec"]["acceptance_lengths"]]
        spec_all += spec
        ar_all += ar
        refs += ref or []
    report["overall"] = _reference_summary(spec_all, ar_all, refs if ar_outputs else None)
    return report


def _reference_summary(spec: list[dict], ar: list[dict], reference) -> dict:
    """The package's acceptance lengths are tokens per verification pass (the prefill's token is
    output but not a pass), the same definition as dflash2's: tau = sum(lengths) / passes."""
    baseline = summarize(ar, None)
    summary = summarize(spec, reference, baseline["time_per_output_token_ms"])
    passes = sum(r["passes"] for r in spec)
    summary["acceptance_length"] = sum(r["committed"] for r in spec) / passes if passes else None
    summary["baseline_tokens_per_second"] = baseline["tokens_per_second"]
    return summary
