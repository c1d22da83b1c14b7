"""Does an inductor-compiled draft pass beat the packed one? Paired, in one process.

Usage: PYTHONPATH=src python scripts/compiled_draft_ab.py [--rounds 60] [--prompts 16] [--max-new-tokens 96]
       [--threads 1] [--dynamic-head]

The shipped draft at bfloat16 beside the bfloat16 target, two forms of its pass:
- `packed`: the shipped form (`DFlash2DraftModel.pack`: oneDNN's prepacked projections, eager);
- `compiled`: a copy of the draft without packs whose backbone (`forward_blocks`) and LM head
  (`logits`) go through `torch.compile` with inductor's `freezing` (weights folded in as constants
  and prepacked by inductor itself) and `cpp_wrapper` (the graph called from C++, not Python);
  the backbone with dynamic shapes (the context grows every cycle), the head at the pass's fixed
  rows unless `--dynamic-head`.
Part 1 decodes `--prompts` of the `fresh` set with the
draft alone (`--speculate always`, T=0, batch 1) in both forms, alternating which goes first, and
prints tokens per second, the per-prompt speed ratio's median, whether the answers are the same,
and each form's milliseconds per cycle in the draft backbone, head and selector. Part 2 times one
draft pass of each form against a plain target step (one chat prompt, rounds interleaved, medians
of process CPU time). Compilation time is printed on its own (the first calls).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections import Counter
from importlib import resources

import torch

from dflash2.data.prompts import PROJECT_SETS
from dflash2.decoding.loop.requests import GenerationConfig
from dflash2.decoding.loop.timing import Stopwatch
from dflash2.decoding.proposers.draft import DraftProposer
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_prompt

PROMPT = "Explain in three sentences why the sky is blue."


def compiled_pass(draft, dynamic_head: bool):
    """(forward_blocks, logits) of a pack-less copy of `draft`, compiled (see the module's text)."""
    bare = copy.deepcopy(draft)            # a copy holds no packs (`Packed.__deepcopy__`)
    bare.pack = lambda: None               # and never makes any: inductor packs the frozen weights itself
    options = {"freezing": True, "cpp_wrapper": True}
    return (torch.compile(bare.forward_blocks, dynamic=True, options=options),
            torch.compile(bare.logits, dynamic=dynamic_head, options=options))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dynamic-head", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pipe = load_decoder("smollm2", None, dtype="bfloat16", draft_dtype="bfloat16", proposer="draft",
                        speculate="always")
    draft, adapter = pipe.decoder.draft, pipe.decoder.target
    forms = {"packed": None, "compiled": compiled_pass(draft, args.dynamic_head)}

    def use(form: str) -> None:   # the decoder's proposers call these two methods of `draft`
        if forms[form] is None:
            draft.__dict__.pop("forward_blocks", None)
            draft.__dict__.pop("logits", None)
        else:
            draft.forward_blocks, draft.logits = forms[form]

    # Part 1: real decoding, paired per prompt
    with open(resources.files("dflash2.data.benchmarks") / PROJECT_SETS["fresh"]) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    started = time.perf_counter()
    use("compiled")
    for prompt in prompts[:2]:    # the shapes of real decoding compile here, not in the timed runs
        pipe.decoder.generate([encode_prompt(pipe.tokenizer, prompt)], GenerationConfig(max_new_tokens=40))
    print(f"\ncompiling for real decoding (2 warm-up prompts): {time.perf_counter() - started:.1f} s")
    tokens, seconds, phases = Counter(), Counter(), {form: Counter() for form in forms}
    same, ratios = 0, []
    for i, prompt in enumerate(prompts[2:2 + args.prompts]):
        ids, out, took = encode_prompt(pipe.tokenizer, prompt), {}, {}
        for form in (("packed", "compiled") if i % 2 else ("compiled", "packed")):
            use(form)
            t = time.perf_counter()
            result = pipe.decoder.generate([ids], config)[0]
            took[form] = time.perf_counter() - t
            out[form] = result.tokens
            tokens[form] += len(result.tokens)
            seconds[form] += took[form]
            phases[form].update(result.timing.phase_seconds)
            phases[form]["cycles"] += result.timing.speculative_cycles
        same += out["packed"] == out["compiled"]
        ratios.append(took["packed"] / took["compiled"])
    n = len(ratios)
    print(f"\n## real decoding: {n} `fresh` prompts x {args.max_new_tokens} tokens, draft alone, T=0, batch 1\n")
    print("| form | tok/s | draft backbone ms / cycle | head ms / cycle | selector ms / cycle |\n|---|---:|---:|---:|---:|")
    for form in forms:
        c = max(phases[form]["cycles"], 1)
        print(f"| {form} | {tokens[form] / seconds[form]:.2f} | {1000 * phases[form]['draft'] / c:.2f} | "
              f"{1000 * phases[form]['draft_head'] / c:.2f} | {1000 * phases[form]['selector'] / c:.2f} |")
    print(f"\ncompiled / packed speed, per-prompt median: {statistics.median(ratios):.3f}; "
          f"identical answers: {same} of {n}")

    # Part 2: one pass against a plain step
    ids = encode_prompt(pipe.tokenizer, PROMPT)
    _, features = adapter.prefill([ids])
    proposer = DraftProposer(draft, Stopwatch(None))
    proposer.add_rows(features, adapter.mask)
    anchors, start, block = torch.tensor([ids[-1]]), adapter.next_position.clone(), draft.config.block_size
    fresh, none_kept = torch.tensor([[ids[-1]]]), torch.zeros(1, dtype=torch.long)

    def plain() -> None:
        adapter.step(fresh)
        adapter.keep(none_kept, 1)

    runs = {"plain step": plain}
    for form in forms:
        runs[form] = lambda form=form: (use(form), proposer.propose(anchors, start, block, 0.0))
    started = time.perf_counter()
    use("compiled")
    proposer.propose(anchors, start, block, 0.0)
    print(f"\ncompiling the pass (a new shape): {time.perf_counter() - started:.1f} s")
    samples = {name: [] for name in runs}
    for _ in range(3):
        for fn in runs.values():
            fn()
    for _ in range(args.rounds):
        for name, fn in runs.items():
            t = time.process_time()
            fn()
            samples[name].append(time.process_time() - t)
    plain_ms = 1000 * statistics.median(samples["plain step"])
    print(f"## one draft pass, bfloat16, batch 1, {args.threads} thread(s), {args.rounds} rounds, CPU time\n")
    print(f"| pass | ms (median) | / plain step ({plain_ms:.2f} ms) |\n|---|---:|---:|")
    for form in forms:
        ms = 1000 * statistics.median(samples[form])
        print(f"| {form} | {ms:.2f} | {ms / plain_ms:.3f} |")

if __name__ == "__main__":
    main()
