"""Component timings of one decoding cycle, measured side by side in one process.

Contract: `python -m dflash2.tools.profile.microbench [--target smollm2] [--draft DIR] [--repeats 9] [--device cpu]
[--dtype float32] [--json OUT]` times, on the same prompt and cache state:
target forward of 1 vs 8 new tokens, the draft forward (context K/V of 8 new positions + block +
logits), the selector (top-K, pair scores, walk), the convolutions (draft forward with convs on
minus off), and end-to-end autoregressive tokens/s of this engine vs Hugging Face `generate()`.
Every figure is the median of `--repeats` runs (after a warm-up); a markdown table is printed.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from tqdm import tqdm

from dflash2.targets.chat import encode_prompt
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.pipeline import load_decoder
from dflash2.decoding.proposers.draft import DraftProposer
from dflash2.decoding.loop.timing import Stopwatch

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def median_seconds(fn, repeats: int, sync) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def phase_medians(fn, repeats: int, watch: Stopwatch) -> dict[str, float]:
    """Median per-call seconds of each Stopwatch phase that `fn` runs (after a warm-up call)."""
    fn()
    samples: dict[str, list[float]] = {}
    for _ in range(repeats):
        before = watch.snapshot()
        fn()
        for phase, total in watch.snapshot().items():
            samples.setdefault(phase, []).append(total - before.get(phase, 0.0))
    return {phase: statistics.median(values) for phase, values in samples.items()}


def run(target: str, draft: str | None, repeats: int, device: str, dtype: str, new_tokens: int) -> dict:
    pipe = load_decoder(target, draft, device, dtype, proposer="draft", lattice=False,
                        implementation="transformers")  # HF generate() below
    decoder, adapter, model = pipe.decoder, pipe.decoder.target, pipe.decoder.target.model
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    ids = encode_prompt(pipe.tokenizer, PROMPT)
    block = decoder.draft.config.block_size
    results: dict[str, float] = {}
    steps = tqdm(total=7, desc="microbench", unit="part")

    # Target: 1 vs 8 new tokens on top of the prompt's cache (rolled back after each call).
    _, features = adapter.prefill([ids])
    for q in (1, block):
        fresh = torch.randint(100, 1000, (1, q), device=adapter.device)

        def target_step():
            adapter.step(fresh)
            adapter.keep(torch.zeros(1, dtype=torch.long), q)
        results[f"target_forward_{q}_tokens_ms"] = 1000 * median_seconds(target_step, repeats, sync)
        steps.update()

    # Draft forward and selector, from the same context.
    proposer = DraftProposer(decoder.draft, Stopwatch(device))
    proposer.add_rows(features, adapter.mask)
    anchors = torch.tensor([ids[-1]], device=adapter.device)
    start = adapter.next_position.clone()

    def propose(p: DraftProposer):
        return lambda: p.propose(anchors, start, block, 0.0)
    for conv_on in (True, False):
        decoder.draft.conv_enabled = conv_on
        medians = phase_medians(propose(proposer), repeats, proposer.stopwatch)
        label = "with_convs" if conv_on else "without_convs"
        results[f"draft_forward_{label}_ms"] = 1000 * (medians["draft"] + medians.get("draft_head", 0.0))
        results[f"draft_lm_head_{label}_ms"] = 1000 * medians.get("draft_head", 0.0)
        if conv_on:
            results["selector_ms"] = 1000 * medians["selector"]
        steps.update()
    decoder.draft.conv_enabled = True
    results["convs_ms"] = results["draft_forward_with_convs_ms"] - results["draft_forward_without_convs_ms"]
    # The same draft in fp32, side by side (the draft dtype cannot change the output).
    draft_dtype = decoder.draft.fc.weight.dtype
    if draft_dtype != torch.float32:
        decoder.draft.float()
        fp32 = DraftProposer(decoder.draft, Stopwatch(device))
        fp32.add_rows(features, adapter.mask)
        medians = phase_medians(propose(fp32), repeats, fp32.stopwatch)
        results["draft_forward_fp32_ms"] = 1000 * (medians["draft"] + medians.get("draft_head", 0.0))
        decoder.draft.to(draft_dtype)
    feats8 = torch.randn(1, block, features.shape[-1], device=adapter.device, dtype=features.dtype)

    def context_append():
        with torch.inference_mode():
            decoder.draft.context_kv(feats8, start[:, None] + torch.arange(block, device=adapter.device))
    results["draft_context_kv_8_ms"] = 1000 * median_seconds(context_append, repeats, sync)
    steps.update()
    adapter.reset()

    # End to end autoregressive: this engine vs Hugging Face generate(), same prompt, greedy.
    ar = decoder.variant(speculate="never")
    config = GenerationConfig(max_new_tokens=new_tokens, stop_token_ids=())
    ours = median_seconds(lambda: ar.generate([ids], config), max(3, repeats // 3), sync)
    steps.update()
    prompt = torch.tensor([ids], device=adapter.device)

    def hf_generate():
        with torch.inference_mode():
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    theirs = median_seconds(hf_generate, max(3, repeats // 3), sync)
    steps.update()
    steps.close()
    results["engine_autoregressive_tokens_per_second"] = new_tokens / ours
    results["hf_generate_tokens_per_second"] = new_tokens / theirs
    results["verify_8_over_1_ratio"] = results[f"target_forward_{block}_tokens_ms"] / results["target_forward_1_tokens_ms"]
    return {"target": target, "draft": pipe.draft_description, "device": device, "dtype": dtype,
            "prompt_tokens": len(ids), "new_tokens": new_tokens, "repeats": repeats,
            "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
            "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash2.tools.profile.microbench")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    report = run(args.target, args.draft, args.repeats, args.device, args.dtype, args.new_tokens)
    print(f"| component ({report['device']}, {report['dtype']}, median of {args.repeats}) | value |\n|---|---|")
    for key, value in report["results"].items():
        print(f"| {key} | {value:.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
