"""The attention op alone, one layer of SmolLM2's shape (9 query heads on 3 KV heads, head size 64):
grouped-query attention by expanding K and V to every head (what the built-in Llama did for passes
of 2 or more tokens before 2026-12-05, and transformers' `repeat_kv` does under a mask) against
folding the query heads onto their KV heads (what it does now) and SDPA's own `enable_gqa`.
Prints the median of 7 timings per shape and the largest difference between the outputs.

    .venv/bin/python scripts/attention_fold.py [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from dflash2.targets.grouped_attention import fold_queries, folded_attention

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
GROUPS = HEADS // KV_HEADS
SHAPES = [(1, 8, 600), (8, 8, 600), (20, 8, 900), (32, 8, 700), (20, 16, 900)]   # batch, queries, slots


def expand_kv(q, k, v, mask):
    b, _, slots, _ = k.shape
    # [b, kv_heads, S, d] -> [b, heads, S, d]: a copy of the cache
    k = k[:, :, None].expand(-1, -1, GROUPS, -1, -1).reshape(b, HEADS, slots, HEAD_DIM)
    v = v[:, :, None].expand(-1, -1, GROUPS, -1, -1).reshape(b, HEADS, slots, HEAD_DIM)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def folded(q, k, v, mask):
    _, mask = fold_queries(mask, q.shape[2], GROUPS)                           # what every target does now
    return folded_attention(q, k, v, mask, None)


def sdpa_gqa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def median_ms(fn, *args, repeats: int = 7) -> float:
    for _ in range(2):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print("| batch, queries, slots | expand K/V ms | fold queries ms | enable_gqa ms | max difference |")
    print("|---|---:|---:|---:|---:|")
    for b, length, slots in SHAPES:
        q = torch.randn(b, HEADS, length, HEAD_DIM, generator=generator)
        k, v = (torch.randn(b, KV_HEADS, slots, HEAD_DIM, generator=generator) for _ in range(2))
        mask = torch.rand(b, 1, length, slots, generator=generator) > 0.1
        reference = expand_kv(q, k, v, mask)
        diff = max((fn(q, k, v, mask) - reference).abs().max().item() for fn in (folded, sdpa_gqa))
        timings = [median_ms(fn, q, k, v, mask) for fn in (expand_kv, folded, sdpa_gqa)]
        print(f"| {b}, {length}, {slots} | " + " | ".join(f"{t:.2f}" for t in timings) + f" | {diff:.1e} |")


if __name__ == "__main__":
    main()
