"""`python -m dflash2.tools.profile.cycles`: where a decoding cycle's time goes, at several batch sizes.

Contract: for each batch size b, `profile(pipe, prompts, b, new_tokens)` decodes b prompts with the
engine itself, once speculatively with the whole block verified every cycle (`--speculate always`,
so every cycle is a full draft + verify) and once plainly (one target step per token), and returns a
`CycleProfile`: milliseconds per cycle of each engine phase -- target verify, draft backbone, draft
LM head, selector, acceptance, cache re-alignment (rolling back rejected slots and re-aligning rows
that accepted different counts, target and draft caches), host copies and bookkeeping, the length
policy -- plus the rest of the loop ("other": Python between the phases), the plain step's
milliseconds, the cycle's cost in plain steps and the share of the cycle that is neither the
target's nor the draft's forward pass. The phases come from the engine's own stopwatch (on CUDA
every phase synchronises, so the sum is real kernel time plus the syncs).

`main(argv)` prints a markdown table (one row per batch size) and, with `--json`, writes the
profiles. Prompts: the first turns of the first prompts of `--datasets`, cycled to fill a batch.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.files.atomic import write_json
from dflash2.errors import DFlash2Error, require
from dflash2.argparsing import ModelSettings, add_model_arguments, first_paragraph, parse_list
from dflash2.data.prompts import load_conversations
from dflash2.pipeline import build_pipeline
from dflash2.runtime.provenance import cpu_model
from dflash2.targets.chat import first_turns

PHASES = ("verify", "draft", "draft_head", "selector", "accept", "realign", "host", "policy")
FORWARD = ("verify", "draft", "draft_head")   # the two models' forward passes (the LM head is the draft's)


@dataclass
class CycleProfile:
    batch: int
    cycles: int
    ms_per_cycle: dict[str, float]        # phase -> ms per cycle, plus "other" and "total"
    plain_step_ms: float                  # one plain (autoregressive) batch step
    cycle_in_plain_steps: float
    non_forward_share: float              # share of a cycle outside the two models' forward passes
    acceptance_length: float


def _decode(decoder, prompts, config):
    results = decoder.generate(prompts, config)
    return results, results[0].timing


def profile(pipe, prompts: list[list[int]], batch: int, new_tokens: int) -> CycleProfile:
    batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
    config = GenerationConfig(max_new_tokens=new_tokens, stop_token_ids=())   # no early stops: full-length rows
    decoder = pipe.decoder.variant(speculate="always")
    _decode(decoder, batch_prompts[:1], GenerationConfig(max_new_tokens=4))                       # warm-up
    results, timing = _decode(decoder, batch_prompts, config)
    cycles = max(timing.speculative_cycles, 1)
    phases = {p: 1000 * timing.phase_seconds.get(p, 0.0) / cycles for p in PHASES}
    total = 1000 * (timing.total_seconds - timing.prefill_seconds) / cycles
    phases["other"] = max(total - sum(phases.values()), 0.0)
    phases["total"] = total
    plain = decoder.variant(speculate="never")
    _decode(plain, batch_prompts[:1], GenerationConfig(max_new_tokens=4))
    _, plain_timing = _decode(plain, batch_prompts, config)
    plain_ms = 1000 * (plain_timing.total_seconds - plain_timing.prefill_seconds) / max(plain_timing.plain_steps, 1)
    committed = sum(sum(r.stats.committed_per_cycle) for r in results)
    forward = sum(phases[p] for p in FORWARD)
    return CycleProfile(batch, cycles, phases, plain_ms, total / plain_ms if plain_ms else 0.0,
                        (total - forward) / total if total else 0.0,
                        committed / sum(r.stats.cycles for r in results))


def render(profiles: list[CycleProfile], header: str) -> str:
    cols = list(PHASES) + ["other", "total"]
    lines = [header, "", "| batch | " + " | ".join(c.replace("_", " ") for c in cols) +
             " | plain step | cycle / plain step | not forward | tau |",
             "|---:|" + "---:|" * (len(cols) + 4)]
    for p in profiles:
        lines.append(f"| {p.batch} | " + " | ".join(f"{p.ms_per_cycle[c]:.1f}" for c in cols) +
                     f" | {p.plain_step_ms:.1f} | {p.cycle_in_plain_steps:.2f} | {100 * p.non_forward_share:.1f} % "
                     f"| {p.acceptance_length:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash2.tools.profile.cycles", description=first_paragraph(__doc__))
    add_model_arguments(parser)
    parser.add_argument("--batch", default="1,8,32", help="comma list of batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--datasets", default="gsm8k,mt-bench")
    parser.add_argument("--json", default=None, help="also write the profiles to this file")
    try:
        args = parser.parse_args(argv)
        batches = [int(b) for b in parse_list(args.batch, "--batch") if b.isdigit() and int(b) > 0]
        require(len(batches) == len(parse_list(args.batch, "--batch")), f"--batch must be positive integers, got '{args.batch}'")
        require(args.new_tokens > 1, f"--new-tokens must be at least 2, got {args.new_tokens}")
        pipe = build_pipeline(ModelSettings.from_args(args).measuring_the_draft())
        require(pipe.decoder.draft is not None, "a cycle profile needs a draft")
        convs = [c for group in load_conversations(parse_list(args.datasets, "--datasets"), 8).values() for c in group]
        prompts = first_turns(convs, pipe.tokenizer)
        profiles = [profile(pipe, prompts, b, args.new_tokens) for b in batches]
    except DFlash2Error as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(render(profiles, f"Cycle profile: {pipe.draft_description}; {cpu_model()}; {args.new_tokens} new tokens per row"))
    if args.json:
        write_json(args.json, [asdict(p) for p in profiles])
    return 0


if __name__ == "__main__":
    sys.exit(main())
