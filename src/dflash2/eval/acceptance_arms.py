"""The arms of `dflash2 acceptance`: one draft decoded on the same prompts by dflash2 at a precision
or by an installed engine, each giving the tokens committed per verification cycle, per prompt.

Contract: every `*_arm` function returns an `Arm` and never raises for an engine's own failure or
absence (status "skipped" with the way to install it, or "failed" with the engine's last line).
All arms decode greedily, batch 1, verifying the draft's whole block every cycle (at most
`block_size - 1` drafts), so their cycles compare one to one:
- `dflash2_arm`: this project's engine, target and draft at `dtype` (`export.acceptance_cost`);
  `form` "dflash-v1" decodes with the draft exported without convolutions and selector (what
  vLLM's CPU build runs), re-loaded.
- `llama_cpp_arm`: `llama-speculative-simple --spec-type draft-dflash --spec-draft-n-max
  block-1` with the draft's GGUF export (`draft_dtype`) and a GGUF of the target (`q4_1`: the
  target's own quantized file; `f32` / `bf16`: that file dequantised, `export.gguf_target`). Its
  prompts are the decoded texts; llama.cpp's tokenization of each is checked against dflash2's ids
  (a prompt that tokenizes otherwise is reported in `notes`, its cycles still counted). Its
  cycles are counted as dflash2 counts them (`as_dflash2_cycles`); its text runs a block longer.
- `runner_arm`: vLLM's CPU build (`dflash-v1` export) or MLX `dflash` (`dflash2` export) in their
  own virtual environments through the runner scripts of `eval.engine_peers`, at `dtype`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash2.errors import DFlash2Error
from dflash2.eval import engine_peers
from dflash2.export import ExportSettings, export_draft
from dflash2.export import llama_cpp
from dflash2.export.acceptance_cost import draft_runs
from dflash2.export.gguf_target import unquantized_gguf
from dflash2.export.neutral import full_vocabulary
from dflash2.model.draft import DFlash2DraftModel
from dflash2.pipeline import load_decoder

LLAMA_TYPES = {"f32": "float32", "bf16": "bfloat16", "q4_1": None}   # GGUF of the target -> dequantised as


@dataclass
class Arm:
    engine: str                      # dflash2 | llama.cpp | vllm | mlx
    precision: str                   # float32 | bfloat16 | float16 (dflash2, vllm, mlx); f32 | bf16 | q4_1 (llama.cpp)
    form: str                        # the draft as the engine loads it
    status: str = "ok"               # ok | skipped | failed
    reason: str = ""
    runs: list[dict] = field(default_factory=list)   # per prompt: committed [...], tokens [...] | None, text | None
    notes: list[str] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.engine} {self.precision} {self.form}"


@dataclass(frozen=True)
class Job:
    draft: Path
    target: str                      # built-in name or local HF directory (dflash2's target)
    target_gguf: Path | None         # the target's own GGUF (llama.cpp), None where there is none
    prompts: list[list[int]]
    texts: list[str]                 # the prompts decoded (llama.cpp takes text)
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    scratch: Path                    # exports and converted GGUFs


def _export(job: Job, form: str, dtype: str) -> Path:
    out = job.scratch / f"draft-{form}-{dtype}"
    if not (out / ("draft.gguf" if form == "gguf" else "config.json")).is_file():
        export_draft(ExportSettings(draft=job.draft, form=form, out=out, force=True, dtype=dtype, measure_prompts=0,
                                    target=str(job.target_gguf) if form == "gguf" else job.target))
    return out


def dflash2_arm(job: Job, dtype: str, form: str = "checkpoint") -> Arm:
    arm = Arm("dflash2", dtype, form)
    start = time.perf_counter()
    try:
        pipe = load_decoder(job.target, str(job.draft), dtype=dtype, draft_dtype=dtype, proposer="draft")
        draft = pipe.decoder.draft
        if draft.config.draft_vocab_size is not None:   # the engines get it scoring the whole vocabulary
            draft = full_vocabulary(draft).to(draft.fc.weight.device)
        if form == "dflash-v1":
            draft = DFlash2DraftModel.from_pretrained(_export(job, "dflash-v1", "float32"),
                                                      dtype=getattr(torch, dtype), device=draft.fc.weight.device)
        results = draft_runs(pipe.decoder.target, draft, job.prompts, job.max_new_tokens, job.stop_ids)
    except DFlash2Error as err:
        return Arm("dflash2", dtype, form, "failed", str(err))
    arm.runs = [{"committed": list(r.stats.committed_per_cycle), "tokens": list(r.tokens), "text": None}
                for r in results]
    arm.versions = {"torch": torch.__version__}
    arm.seconds = time.perf_counter() - start
    return arm


def as_dflash2_cycles(committed: list[int], max_new_tokens: int) -> list[int]:
    """llama.cpp's cycles as dflash2 counts them. llama.cpp keeps the prompt's last token out of
    its prefill and makes the first verification pass from it (drafts included): that pass commits
    the first new token, which dflash2 takes from its prefill, so it is left out. Its run asks for
    a block more than `max_new_tokens`; the cycles are cut where dflash2's run stops (a cycle cut
    short counts what it committed within the budget, as dflash2 counts it)."""
    out, budget = [], max_new_tokens - (committed[0] if committed else 0)
    for tokens in committed[1:]:
        if budget <= 0:
            break
        out.append(min(tokens, budget))
        budget -= out[-1]
    return out


def llama_cpp_arm(job: Job, lc: llama_cpp.LlamaCpp | None, kind: str, block_size: int, threads: int) -> Arm:
    draft_dtype = "bfloat16" if kind == "bf16" else "float32"
    arm = Arm("llama.cpp", kind, f"gguf ({draft_dtype})")
    if lc is None:
        return Arm("llama.cpp", kind, arm.form, "skipped", llama_cpp.INSTALL_HINT)
    if job.target_gguf is None:
        return Arm("llama.cpp", kind, arm.form, "skipped", "the target has no GGUF of its own (a built-in target "
                                                            "has; or pass --target-gguf FILE)")
    start = time.perf_counter()
    try:
        target = job.target_gguf
        if LLAMA_TYPES[kind] is not None:
            target = job.scratch / f"target-{kind}.gguf"
            if not target.is_file():
                unquantized_gguf(job.target_gguf, target, LLAMA_TYPES[kind])
        draft = _export(job, "gguf", draft_dtype) / "draft.gguf"
        arm.versions = {"llama.cpp": lc.version()}
        for ids, text in zip(job.prompts, job.texts):
            if llama_cpp.tokenize(lc, target, text) != list(ids):
                arm.notes.append(f"llama.cpp tokenizes prompt {len(arm.runs)} otherwise than dflash2")
            run = llama_cpp.speculative(lc, llama_cpp.Run(target, text, job.max_new_tokens + block_size, draft,
                                                           n_max=block_size - 1, threads=threads,
                                                           verbose=True))
            arm.runs.append({"committed": as_dflash2_cycles(run.committed, job.max_new_tokens), "tokens": None,
                             "text": run.text, "first_pass": run.committed[:1],
                             "n_drafted": run.n_drafted, "n_accept": run.n_accept})
    except DFlash2Error as err:
        return Arm("llama.cpp", kind, arm.form, "failed", str(err))
    arm.seconds = time.perf_counter() - start
    return arm


def runner_arm(job: Job, short: str, dtype: str, threads: int, python: str | None = None) -> Arm:
    spec = {"vllm": "vllm-dflash", "mlx": "mlx-dflash"}[short]
    peer = next(p for p in engine_peers.ENGINE_PEERS if p.short == spec)
    arm = Arm(short, dtype, peer.draft_form)
    exe = engine_peers.engine_python(peer, python)
    if exe is None:
        return Arm(short, dtype, peer.draft_form, "skipped", f"not installed: `{peer.setup}` (or set {peer.env})")
    if not Path(job.target).is_dir():
        return Arm(short, dtype, peer.draft_form, "skipped", f"target '{job.target}' is not a local directory")
    request = {"target": str(job.target), "draft": str(_export(job, peer.draft_form, "float32")),
               "num_speculative_tokens": 7, "dtype": dtype, "threads": threads,
               "max_new_tokens": job.max_new_tokens, "stop_token_ids": list(job.stop_ids),
               "prompts": {"acceptance": job.prompts}}
    start = time.perf_counter()
    result = engine_peers.run_runner(peer, exe, request)
    if not result.get("ok"):
        return Arm(short, dtype, peer.draft_form, "failed", str(result.get("error")))
    arm.runs = [{"committed": r["acceptance_lengths"], "tokens": r["tokens"], "text": None}
                for r in result["datasets"]["acceptance"]]
    arm.versions, arm.notes = result.get("versions", {}), list(result.get("notes", []))
    arm.seconds = time.perf_counter() - start
    return arm
