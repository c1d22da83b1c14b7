"""Speculation modes and proposers side by side, prompt by prompt, on the default target (a dev script).

    python scripts/policy_ab.py [--proposer draft] [--start 20] [--prompts 4] [--tokens 96]
                                [--variants never,always,auto,nofallback] [--sets gsm8k,...,grounded]

Every variant is a decoder over the same target and shipped draft; each prompt (its first turn,
chat template) is decoded by all of them in turn, who goes first rotating from prompt to prompt, so
a noisy host's drift hits all alike. Variants: `never` (plain decoding, the baseline), `always`
(the whole block every cycle), `auto` (the shipped policy), `nofallback` (`auto` whose draft pass
never stops: its per-cycle choices alone, an upper bound for any stopping rule), and `draft`,
`lookup`, `hybrid` (those proposers under `auto`). Prints per set the pooled ratio of the
baseline's time per output token to each variant's (prefill excluded), the median over prompts in
brackets, draft cycles / plain steps and tau; every output is checked against the baseline's (T=0).
Prompts `--start` .. `--start + --prompts` of each set: the full protocol uses the first 20.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from dflash2.data.prompts import load_conversations
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.policy import SpeculationPolicy
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_messages

GROUNDED = "src/dflash2/data/benchmarks/grounded.jsonl"


class NoFallback(SpeculationPolicy):
    """`auto` whose draft pass never stops: a fallback the evidence starts is called off at once."""

    def observe(self, record) -> None:
        super().observe(record)
        self.fallback = self.fallback.cancel()


def make(variant: str, proposer: str, decoder: SpeculativeDecoder) -> SpeculativeDecoder:
    """`variant` as a sibling of `decoder` (the target with its draft); nothing learnt of the proposers."""
    if variant in ("never", "always"):
        return decoder.variant(proposer, speculate=variant)
    if variant in ("draft", "lookup", "hybrid"):
        return decoder.variant(variant, speculate="auto")
    sibling = decoder.variant(proposer, speculate="auto")
    if variant == "nofallback":
        sibling.policy = NoFallback("auto", sibling.policy.costs, sources=sibling.policy.settings.sources)
    return sibling


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proposer", default="draft")
    p.add_argument("--start", type=int, default=20)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--variants", default="never,always,auto,nofallback")
    p.add_argument("--sets", default="gsm8k,math500,humaneval,mbpp,mt-bench,grounded")
    args = p.parse_args()
    variants, sets = args.variants.split(","), args.sets.split(",")
    pipe = load_decoder("smollm2", proposer="hybrid")
    decoders = {v: make(v, args.proposer, pipe.decoder) for v in variants}
    convs = load_conversations([s for s in sets if s != "grounded"], args.start + args.prompts,
                               [GROUNDED] if "grounded" in sets else None)
    prompts = [(name, encode_messages(pipe.tokenizer, [{"role": "user", "content": c.turns[0]}]))
               for name, cs in convs.items() for c in cs[args.start:args.start + args.prompts]]
    config = GenerationConfig(max_new_tokens=args.tokens, temperature=0.0, stop_token_ids=pipe.stop_token_ids)
    for variant, decoder in decoders.items():   # untimed warm-up, then nothing learnt of the draft
        decoder.generate([prompts[0][1]], GenerationConfig(max_new_tokens=8))
        decoders[variant] = fresh = decoder.variant()
        if variant == "nofallback":
            fresh.policy = NoFallback("auto", fresh.policy.costs, sources=fresh.policy.settings.sources)
    rows: dict[str, dict[str, list[tuple]]] = {v: {} for v in variants}
    for i, (name, ids) in enumerate(prompts):
        turn, outputs = i % len(variants), {}
        for v in variants[turn:] + variants[:turn]:
            clock = time.perf_counter()
            [result] = decoders[v].generate([ids], config)
            seconds = time.perf_counter() - clock - result.timing.prefill_seconds
            outputs[v] = result.tokens
            st = result.stats
            rows[v].setdefault(name, []).append((seconds, st.new_tokens, st.cycles, st.plain_steps,
                                                 sum(st.committed_per_cycle)))
        if any(out != outputs[variants[0]] for out in outputs.values()):
            print(f"MISMATCH in {name} prompt {i}", file=sys.stderr)
            return 1
    base = variants[0]
    print("| set | " + " | ".join(variants) + " |")
    print("|---" * (len(variants) + 1) + "|")
    totals = {v: [0.0, 0] for v in variants}
    for name in rows[base]:
        cells = []
        for v in variants:
            b, x = rows[base][name], rows[v][name]
            pooled = (sum(r[0] for r in b) / sum(r[1] for r in b)) / (sum(r[0] for r in x) / sum(r[1] for r in x))
            median = statistics.median((rb[0] / rb[1]) / (rx[0] / rx[1]) for rb, rx in zip(b, x))
            cycles, plain, committed = (sum(r[k] for r in x) for k in (2, 3, 4))
            cells.append(f"{pooled:.2f} ({median:.2f}) {cycles}/{plain} tau {committed / cycles if cycles else 0:.2f}")
            totals[v][0] += sum(r[0] for r in x)
            totals[v][1] += sum(r[1] for r in x)
        print(f"| {name} | " + " | ".join(cells) + " |")
    unit = totals[base][0] / totals[base][1]
    print("| **overall** | " + " | ".join(f"{unit / (t[0] / t[1]):.3f}" for t in totals.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
