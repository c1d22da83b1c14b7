"""Whole decoders on a transformers-loaded target, its attention as transformers ships it (`sdpa`,
K and V repeated per query head under a mask) against `targets.grouped_attention`'s fold (what the
engine does now). SmolLM2 through transformers' classes (`implementation="transformers"`, 9 query
heads on 3 KV heads), fp32, T=0, one batch of `--batch` prompts a repetition, the arms alternating
(order rotating per repetition), a fresh decoder per run. Prints seconds per run, the median ratio
stock / folded per decoder, and whether every arm wrote the same tokens.

    .venv/bin/python scripts/transformers_fold_ab.py [--set math500] [--batch 8] [--reps 2] [--tokens 128]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from dflash2.data.prompts import load_conversations
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_messages
from dflash2.targets.grouped_attention import stock_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="math500", help="a shipped benchmark set")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()

    pipe = load_decoder("smollm2", proposer="hybrid", implementation="transformers")
    model = pipe.decoder.target.model
    conversations = load_conversations([args.set], args.batch * args.reps)[args.set]
    config = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, stop_token_ids=pipe.stop_token_ids)
    decoders = {"plain": lambda: pipe.decoder.variant(speculate="never"), "hybrid": lambda: pipe.decoder.variant()}
    arms = [(decoder, kernel) for decoder in decoders for kernel in ("stock", "folded")]
    seconds = {arm: [] for arm in arms}
    outputs = {}
    for rep in range(args.reps):
        batch = conversations[rep * args.batch:(rep + 1) * args.batch]
        prompts = [encode_messages(pipe.tokenizer, [{"role": "user", "content": c.turns[0]}]) for c in batch]
        order = arms[rep % len(arms):] + arms[:rep % len(arms)]
        for decoder, kernel in order:
            with stock_attention(model) if kernel == "stock" else contextlib.nullcontext():
                run = decoders[decoder]()
                start = time.perf_counter()
                results = run.generate(prompts, config)
                seconds[(decoder, kernel)].append(time.perf_counter() - start)
            outputs[(rep, decoder, kernel)] = [r.tokens for r in results]
        print(f"rep {rep}: " + ", ".join(f"{d} {k} {seconds[(d, k)][-1]:.1f} s" for d, k in arms), flush=True)
    for decoder in decoders:
        ratios = [s / f for s, f in zip(seconds[(decoder, "stock")], seconds[(decoder, "folded")])]
        print(f"{decoder}: folded is {statistics.median(ratios):.2f}x stock (median of {len(ratios)}; "
              f"each {', '.join(f'{r:.2f}' for r in ratios)})")
    same = all(outputs[(rep, d, k)] == outputs[(rep, "plain", "stock")] for rep in range(args.reps) for d, k in arms)
    print("identical tokens in every arm:", same)


if __name__ == "__main__":
    main()
