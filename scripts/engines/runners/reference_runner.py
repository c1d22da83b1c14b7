"""Runs the reference implementation (PyPI `dflash` 0.1.0, transformers backend) for `dflash2 bench`.

Contract: this file is executed as a script by the *peers* virtual environment
(`scripts/setup_peers.sh`), never imported by dflash2, and imports nothing from dflash2 (that
venv has its own transformers pin). Protocol:

    PEERS_PYTHON reference_runner.py RESULT.json  < request.json

request: {"target": dir, "draft": dir, "device": "cpu", "dtype": "float32", "max_new_tokens": N,
          "temperature": T, "top_p": p, "top_k": k, "stop_token_ids": [...], "seed": s,
          "threads": n | null, "prompts": {dataset: [[token ids], ...]}}
result:  {"ok": true, "versions": {...}, "block_size": B, "load_info": {...}, "notes": [...],
          "datasets": {dataset: [{"spec": RUN, "ar": RUN}, ...]}}
         RUN = {"tokens": [...], "acceptance_lengths": [...], "seconds": s, "time_per_output_token": s}
      or {"ok": false, "error": "one line", "traceback": "..."}

Both runs of a prompt use the package's own `dflash_generate`: "spec" with the draft's block size,
"ar" with block size 1 (the package's autoregressive baseline, as its own benchmark does). The
target is loaded with the package's pinned transformers from the local directory, the draft with
the package's own `DFlash2DraftModel.from_pretrained` (or `DFlashDraftModel` for v1 checkpoints).
Progress goes to stderr.
"""
from __future__ import annotations

import sys
import time


from protocol import answer


def log(message: str) -> None:
    print(f"[dflash reference] {message}", file=sys.stderr, flush=True)


def load_models(request: dict):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import dflash.model as reference

    dtype = getattr(torch, request["dtype"])
    device = torch.device(request["device"])
    target = AutoModelForCausalLM.from_pretrained(request["target"], dtype=dtype, attn_implementation="sdpa",
                                                  local_files_only=True).to(device).eval()
    draft_config = AutoConfig.from_pretrained(request["draft"], local_files_only=True)
    is_v2 = "DFlash2DraftModel" in (draft_config.architectures or [])
    cls = reference.DFlash2DraftModel if is_v2 else reference.DFlashDraftModel
    draft, info = cls.from_pretrained(request["draft"], attn_implementation="sdpa", dtype=dtype,
                                      local_files_only=True, output_loading_info=True)
    load_info = {key: sorted(str(v) for v in values) for key, values in info.items() if isinstance(values, (list, set))}
    return target, draft.to(device).eval(), load_info, ("DFlash2DraftModel" if is_v2 else "DFlashDraftModel")


def generate(reference, draft, target, ids, request: dict, block_size: int) -> dict:
    import torch

    input_ids = torch.tensor([ids], device=target.device)
    start = time.perf_counter()
    out = reference.dflash_generate(draft, target, input_ids, request["max_new_tokens"],
                                    request["stop_token_ids"] or None, request["temperature"], request["top_p"],
                                    request["top_k"], block_size=block_size, return_stats=True)
    seconds = time.perf_counter() - start
    return {"tokens": out.output_ids[0, out.num_input_tokens:].tolist(),
            "acceptance_lengths": [int(a) for a in out.acceptance_lengths], "seconds": seconds,
            "time_per_output_token": float(out.time_per_output_token)}


def run(request: dict) -> dict:
    import torch
    import transformers

    import dflash.model as reference

    notes = []
    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    if not torch.cuda.is_available():
        # dflash 0.1.0 reads its stats clock through torch.cuda.synchronize(), which raises on a
        # machine without CUDA; the plain wall clock is the honest equivalent on a CPU.
        reference._cuda_time = time.perf_counter
        notes.append("no CUDA: the package's stats clock (torch.cuda.synchronize + perf_counter) was replaced "
                     "by perf_counter; its own CLI hard-codes cuda:0 and bfloat16 and is not used")
    log(f"loading target {request['target']} and draft {request['draft']} ({request['dtype']}, {request['device']})")
    target, draft, load_info, arch = load_models(request)
    if load_info.get("missing_keys") or load_info.get("unexpected_keys"):
        notes.append(f"draft weights not matched by the reference loader: {load_info}")
    block = int(draft.block_size)
    torch.manual_seed(int(request.get("seed", 0)))
    first = next(p for prompts in request["prompts"].values() for p in prompts)
    warm = dict(request, max_new_tokens=min(8, request["max_new_tokens"]))
    for bs in (1, block):  # warm-up, as the package's own benchmark does
        generate(reference, draft, target, first, warm, bs)
    results = {}
    for name, prompts in request["prompts"].items():
        rows = []
        for i, ids in enumerate(prompts):
            rows.append({"spec": generate(reference, draft, target, ids, request, block),
                         "ar": generate(reference, draft, target, ids, request, 1)})
            log(f"{name}: {i + 1}/{len(prompts)}")
        results[name] = rows
    import dflash

    version = getattr(dflash, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("dflash")
    return {"ok": True, "block_size": block, "architecture": arch, "load_info": load_info, "notes": notes,
            "versions": {"dflash": version, "torch": torch.__version__, "transformers": transformers.__version__},
            "datasets": results}


if __name__ == "__main__":
    raise SystemExit(answer(run, sys.argv[1:], "reference_runner.py"))
