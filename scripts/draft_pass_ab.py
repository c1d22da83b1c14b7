"""What one proposal pass costs: the DFlash2 draft's block pass against an MTP head's k recursive steps.

Paired and interleaved in one process (A, B, B, A, ... medians): on the same target context (a
prefilled chat prompt per row), each proposer proposes k = block - 1 tokens again and again, at
each batch size and block size; prints the median milliseconds per proposal and the ratio. The
weights do not change the cost, so an untrained head (`dflash2 init-draft --family mtp`) measures
the same as a trained one.

    python scripts/draft_pass_ab.py --head /tmp/head [--draft DIR] [--batch 1,8] [--block 4,8] [--repeats 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dflash2.decoding.loop.following import prompt_following
from dflash2.decoding.loop.timing import Stopwatch
from dflash2.decoding.proposers.kinds import drafter_for
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.model.families import load_draft
from dflash2.pipeline import draft_dtype_for, shipped_draft_path
from dflash2.targets.builtin import load_target
from dflash2.targets.chat import encode_prompt

PROMPT = "Explain, step by step, how a bicycle gear system changes the effort needed to climb a hill."


def proposer_for(model, target, tokenizer, batch: int):
    """A proposer of `model` over `batch` rows of the prompt, prefilled; -> (proposer, anchors, start)."""
    adapter = TargetAdapter(target, model.config.target_layer_ids)
    model.bind_target(adapter.embed_weight(), adapter.lm_head_weight())
    ids = encode_prompt(tokenizer, PROMPT)
    logits, features, mask = adapter.add_rows([ids] * batch)
    adapter.close()                                   # the proposers keep what they need of the context
    first = logits[:, -1].argmax(dim=-1)
    proposer = drafter_for(model, adapter).new(Stopwatch(None))
    proposer.add_rows(features, mask, following=prompt_following([ids] * batch, first, mask.shape[1]))
    return proposer, first, adapter.next_position.clone()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--head", required=True, help="an MTP head checkpoint")
    p.add_argument("--draft", default=None, help="a DFlash draft (default: the shipped SmolLM2 draft)")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--block", default="4,8")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_target("smollm2")
    dtype = draft_dtype_for("auto", "cpu", torch.float32)
    models = {"dflash2": load_draft(args.draft or shipped_draft_path("smollm2"), dtype),
              "mtp": load_draft(args.head, dtype)}
    print(f"| batch | block | dflash2 ms | mtp ms | mtp / dflash2 |  (draft dtype {dtype}, threads "
          f"{torch.get_num_threads()})\n|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for batch in [int(b) for b in args.batch.split(",")]:
            for block in [int(b) for b in args.block.split(",")]:
                runs = {name: proposer_for(model, target, tokenizer, batch) for name, model in models.items()}
                times = {name: [] for name in runs}
                for repeat in range(args.repeats):
                    order = list(runs) if repeat % 2 == 0 else list(runs)[::-1]    # who goes first alternates
                    for name in order:
                        proposer, anchors, start = runs[name]
                        clock = time.perf_counter()
                        proposer.propose(anchors, start, block, 0.0)
                        times[name].append(1000 * (time.perf_counter() - clock))
                med = {name: statistics.median(t[2:]) for name, t in times.items()}   # the first two warm up
                print(f"| {batch} | {block} | {med['dflash2']:.1f} | {med['mtp']:.1f} | {med['mtp'] / med['dflash2']:.2f} |")


if __name__ == "__main__":
    main()
