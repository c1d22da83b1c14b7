"""Serving engines as peers of `dflash2 bench --peers`: vLLM's CPU build and MLX with `dflash`.

Contract: `engine_peer(spec, python, target_dir, draft_dir, prompts, ar_outputs, config, stop_ids)`
runs one engine in its own virtual environment through its runner script (`vllm_runner.py`,
`mlx_runner.py`, same JSON-file protocol as `reference_runner.py`) and returns a peer report of
`dflash2.eval.peers` (status ok / unavailable / failed, never raises). `ENGINE_PEERS` names them:

- `vllm`: vLLM CPU, the target alone (autoregressive), batch 1;
- `vllm-dflash`: vLLM CPU with the draft exported as DFlash v1 (`dflash2 export --to dflash-v1`;
  the CPU build's V1 runner has no DFlash2 selector), 7 speculative tokens, batch 1;
- `mlx-dflash`: MLX (CPU backend) with `dflash.model_mlx` and the draft exported as DFlash2.

`engine_python(spec, explicit)` finds the venv's python: `explicit`, else the spec's environment
variable, else the spec's venv directory in the current directory or the source checkout. A
missing venv is `unavailable` with the command that creates it. Greedy only: at T > 0 the engines
are reported `unavailable` (their runners decode greedily, which the lossless comparison needs).
`exported_draft(draft_dir, form, scratch, dtype)` writes the export the engine loads (llama.cpp's too);
`run_runner(spec, python, request)` is the one call of a runner script (its result JSON, or
`{"ok": false, "error": ...}`), shared with `dflash2 acceptance` and scripts/engines/check.py.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dflash2.eval.peers import _report, _run_streaming, summarize
from dflash2.export import ExportSettings, export_draft

RUNNERS = Path(__file__).resolve().parents[3] / "scripts" / "engines" / "runners"   # out-of-process engine scripts


@dataclass(frozen=True)
class EnginePeer:
    key: str            # report key in results.json
    short: str          # name in --peers
    runner: str         # runner script in RUNNERS
    venv: str           # default venv directory
    env: str            # environment variable naming the venv's python
    setup: str          # command that creates the venv
    draft_form: str | None  # export form the engine loads (None: no draft)
    description: str


ENGINE_PEERS = (
    EnginePeer("vllm_cpu", "vllm", "vllm_runner.py", ".venv-vllm", "DFLASH2_VLLM_PYTHON",
               "bash scripts/engines/setup_vllm.sh", None,
               "vLLM 0.32 CPU build (vllm-cpu), target alone, autoregressive, batch 1"),
    EnginePeer("vllm_cpu_dflash_v1", "vllm-dflash", "vllm_runner.py", ".venv-vllm", "DFLASH2_VLLM_PYTHON",
               "bash scripts/engines/setup_vllm.sh", "dflash-v1",
               "vLLM 0.32 CPU build with the draft exported as DFlash v1, 7 speculative tokens, batch 1"),
    EnginePeer("mlx_dflash", "mlx-dflash", "mlx_runner.py", ".venv-mlx", "DFLASH2_MLX_PYTHON",
               "bash scripts/engines/setup_mlx.sh", "dflash2",
               "MLX 0.32 (CPU backend) with dflash 0.1.0 model_mlx and the DFlash2 export, batch 1"),
)
ENGINE_PEER_NAMES = tuple(p.short for p in ENGINE_PEERS)


def engine_python(spec: EnginePeer, explicit: str | None = None) -> Path | None:
    named = explicit or os.environ.get(spec.env)
    if named:
        return Path(named) if Path(named).is_file() else None
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = root / spec.venv / "bin" / "python"
        if candidate.is_file():
            return candidate
    return None


def exported_draft(draft_dir: str, form: str, scratch: Path, dtype: str = "auto", **options) -> Path:
    """The export in `scratch/draft-FORM[-DTYPE]` (replaced); `options`: other `ExportSettings` fields."""
    out = scratch / (f"draft-{form}" if dtype == "auto" else f"draft-{form}-{dtype}")
    export_draft(ExportSettings(draft=Path(draft_dir), form=form, out=out, force=True, dtype=dtype, measure_prompts=0,
                                **options))
    return out


def run_runner(spec: EnginePeer, exe: Path, request: dict, timeout: float = 6 * 3600) -> dict:
    """The runner's answer to `request` (its result JSON), or {"ok": false, "error": one line} when
    it could not start (then also "cannot_start": true), timed out or wrote no result."""
    with tempfile.TemporaryDirectory(prefix="dflash2-engine-") as tmp:
        result_file = Path(tmp) / "result.json"
        try:
            code, tail = _run_streaming([str(exe), str(RUNNERS / spec.runner), str(result_file)], json.dumps(request),
                                        timeout)
        except OSError as err:
            return {"ok": False, "cannot_start": True, "error": f"cannot start {exe}: {err}"}
        if code is None:
            return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
        if not result_file.is_file():
            last = [line for line in tail if line.strip()][-1:] or ["no output"]
            return {"ok": False, "error": f"runner exited {code}: {last[0][:400]}"}
        return json.loads(result_file.read_text())


def engine_peer(spec: EnginePeer, python: str | None, target_dir: str | None, draft_dir: str | None,
                prompts: dict[str, list[list[int]]], ar_outputs: dict[str, list[list[int]]] | None,
                config, stop_ids, scratch: Path, timeout: float = 6 * 3600) -> dict:
    exe = engine_python(spec, python)
    if exe is None:
        where = python or os.environ.get(spec.env) or f"{spec.venv}/bin/python"
        return _report("unavailable", spec.description, reason=f"venv not found ({where}); create it with "
                                                               f"`{spec.setup}` (docs/engines.md)")
    if config.temperature > 0:
        return _report("unavailable", spec.description, reason="engine peers run greedy only (T=0)")
    if not target_dir or not Path(target_dir).is_dir():
        return _report("unavailable", spec.description, reason=f"target '{target_dir}' is not a local directory")
    try:
        draft = str(exported_draft(draft_dir, spec.draft_form, scratch)) if spec.draft_form else None
    except Exception as err:  # e.g. a v1 draft cannot take the DFlash2 form: reported, not fatal
        return _report("unavailable", spec.description, reason=f"export failed: {err}")
    request = {"target": str(target_dir), "draft": draft, "num_speculative_tokens": 7,
               "max_new_tokens": config.max_new_tokens, "stop_token_ids": list(stop_ids), "prompts": prompts}
    result = run_runner(spec, exe, request, timeout)
    if not result.get("ok"):
        status = "unavailable" if result.get("cannot_start") else "failed"
        return _report(status, spec.description, reason=result.get("error"), traceback=result.get("traceback"))
    report = _report("ok", spec.description, versions=result["versions"])
    report["notes"] = list(result.get("notes", []))
    everything, refs = [], []
    for name, runs in result["datasets"].items():
        rows = [{"tokens": r["tokens"], "seconds": r["seconds"],
                 "passes": len(r["acceptance_lengths"]) if result["speculative"] else None} for r in runs]
        ref = ar_outputs[name] if ar_outputs else None
        report["datasets"][name] = summarize(rows, ref)
        if result["speculative"]:  # tau over verification passes, the prefill's token excluded
            committed = sum(sum(r["acceptance_lengths"]) for r in runs)
            passes = sum(len(r["acceptance_lengths"]) for r in runs)
            report["datasets"][name]["acceptance_length"] = committed / passes if passes else None
        everything += runs
        refs += ref or []
    rows = [{"tokens": r["tokens"], "seconds": r["seconds"]} for r in everything]
    report["overall"] = summarize(rows, refs if ar_outputs else None)
    if result["speculative"]:
        passes = sum(len(r["acceptance_lengths"]) for r in everything)
        report["overall"]["acceptance_length"] = sum(sum(r["acceptance_lengths"]) for r in everything) / passes \
            if passes else None
    else:
        report["overall"]["acceptance_length"] = 1.0
        report["notes"].append("acceptance length of an autoregressive decoder is 1 by definition")
    return report
