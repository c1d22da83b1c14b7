"""Runs MLX with the `dflash` package's MLX backend (`dflash.model_mlx`, `mlx` CPU build) on
token-id prompts, for `dflash2 bench --peers` and scripts/engines_check.sh.

Contract: executed as a script by the MLX virtual environment (`scripts/engines/setup_mlx.sh`,
default `.venv-mlx`), never imported by dflash2, importing nothing from it. Protocol:

    MLX_PYTHON mlx_runner.py RESULT.json  < request.json

request: {"target": HF dir, "draft": dir | null, "max_new_tokens": N, "stop_token_ids": [...],
          "dtype": "float32" (default, as stored) | "bfloat16" | "float16",
          "fix_rope_theta": true, "prompts": {dataset: [[token ids], ...]}}
result:  {"ok": true, "engine": "mlx", "versions": {...}, "speculative": bool, "notes": [...],
          "datasets": {dataset: [RUN, ...]}}
         RUN = {"tokens": [...], "acceptance_lengths": [...], "seconds": s}
      or {"ok": false, "error": "one line", "traceback": "..."}

The target is loaded by `mlx_lm.load` from the local directory (fp32 as stored); another `dtype`
casts the target's and the draft's parameters (`nn.Module.set_dtype`). With a draft:
`dflash.model_mlx.load_draft` (it asks the hub for a snapshot of its argument; the runner hands it
the local directory instead) and `stream_generate`, greedy; each response after the first is one
verification and carries its committed tokens (`accepted`), the first is the prefill's token.
Without a draft: `mlx_lm`'s own greedy `generate_step` (the MLX target alone, acceptance 1), to
show where the MLX target itself departs from the Hugging Face one. Stop ids end a sequence as in
dflash2 (the stop token is kept, and it ends the sequence even when it is not the tokenizer's eos).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path


from protocol import answer


def log(message: str) -> None:
    print(f"[mlx runner] {message}", file=sys.stderr, flush=True)


def faithful_target(target: str, scratch: Path) -> tuple[str, str | None]:
    """mlx-lm's Llama reads RoPE's base from a top-level `rope_theta` (default 10000) and ignores
    transformers 5's `rope_parameters`; a target that only has the latter (SmolLM2 converted here:
    100000) would run with the wrong RoPE. With `fix_rope_theta` the runner loads a scratch copy
    (weights symlinked) whose config also carries `rope_theta`."""
    config = json.loads((Path(target) / "config.json").read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if "rope_theta" in config or theta is None:
        return target, None
    scratch.mkdir(parents=True, exist_ok=True)
    for item in Path(target).iterdir():
        if item.name != "config.json":
            (scratch / item.name).symlink_to(item.resolve())
    (scratch / "config.json").write_text(json.dumps(dict(config, rope_theta=theta), indent=2))
    return str(scratch), (f"target config has rope_parameters.rope_theta={theta} but no top-level rope_theta, "
                          "which mlx-lm reads (default 10000): loaded a copy with rope_theta set (same weights)")


def load(request: dict, scratch: Path):
    import dflash.model_mlx as dm
    from mlx_lm import load as mlx_load

    target, note = request["target"], None
    if request.get("fix_rope_theta", True):
        target, note = faithful_target(target, scratch / "target")
    model, tokenizer = mlx_load(target)
    request["_note"] = note
    draft = None
    if request.get("draft"):
        dm.snapshot_download = lambda repo_id, **_: repo_id  # a local directory, never the hub
        draft = dm.load_draft(request["draft"])
    if request.get("dtype", "float32") != "float32":
        import mlx.core as mx
        for module in (model, draft):
            if module is not None:
                module.set_dtype(getattr(mx, request["dtype"]))
    return model, tokenizer, draft


def speculative(model, tokenizer, draft, ids, max_new, stops) -> dict:
    import dflash.model_mlx as dm

    tokenizer.eos_token_ids = set(stops) | set(getattr(tokenizer, "eos_token_ids", ()) or ())
    start = time.perf_counter()
    tokens, lengths = [], []
    for response in dm.stream_generate(model, draft, tokenizer, ids, max_tokens=max_new, temperature=0.0):
        new = list(response.tokens)
        if response.accepted is not None and new:
            lengths.append(len(new))
        tokens += new
        if any(t in stops for t in new):
            break
    return {"tokens": tokens, "acceptance_lengths": lengths, "seconds": time.perf_counter() - start}


def autoregressive(model, ids, max_new, stops) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    start = time.perf_counter()
    tokens = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=max_new, sampler=lambda x: mx.argmax(x, axis=-1)):
        tokens.append(int(token))
        if tokens[-1] in stops:
            break
    return {"tokens": tokens, "acceptance_lengths": [1] * max(len(tokens) - 1, 0),
            "seconds": time.perf_counter() - start}


def run(request: dict) -> dict:
    import mlx.core as mx
    import mlx_lm
    from importlib.metadata import version

    log(f"loading {request['target']} with draft {request.get('draft')} on {mx.default_device()}")
    scratch = Path(tempfile.mkdtemp(prefix="dflash2-mlx-"))
    model, tokenizer, draft = load(request, scratch)
    stops = set(request.get("stop_token_ids") or [])
    max_new = int(request["max_new_tokens"])

    def one(ids, n):
        return speculative(model, tokenizer, draft, ids, n, stops) if draft is not None else \
            autoregressive(model, ids, n, stops)

    first = next(p for prompts in request["prompts"].values() for p in prompts)
    one(first, min(8, max_new))  # warm-up
    datasets = {}
    for name, prompts in request["prompts"].items():
        datasets[name] = []
        for i, ids in enumerate(prompts):
            datasets[name].append(one(ids, max_new))
            log(f"{name}: {i + 1}/{len(prompts)}")
    notes = [f"greedy, batch 1, {request.get('dtype', 'float32')}, "
             f"{'dflash.model_mlx.stream_generate' if draft is not None else 'mlx_lm generate_step'}"
             f", device {mx.default_device()}"] + ([request["_note"]] if request.get("_note") else [])
    return {"ok": True, "engine": "mlx", "speculative": draft is not None, "notes": notes,
            "versions": {"mlx": mx.__version__, "mlx-lm": mlx_lm.__version__, "dflash": version("dflash")},
            "datasets": datasets}


if __name__ == "__main__":
    raise SystemExit(answer(run, sys.argv[1:], "mlx_runner.py"))
