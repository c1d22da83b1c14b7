"""Per-cycle trace of one decode: what the policy chose each cycle and what it committed.

Usage: PYTHONPATH=src python scripts/cycle_trace.py --prompt TEXT [--proposer hybrid] [--dtype float32]
       [--speculate auto] [--max-new-tokens 128] [--threads 2] [--runs 1] [--json OUT]

Decodes the prompt (chat template, T=0) once untimed and then `--runs` times with the same
decoder (each run with a fresh policy, as `generate --compare` does: costs kept, nothing learned
of the draft), and once plainly, recording every cycle through the policy's `observe` hook:
whether the draft pass ran (and was a probe), each row's source and the tokens it verified and
accepted, the pass width, the draft / verify / other milliseconds, and the policy's evidence of
the draft's gain after the cycle. Prints per run the totals (draft cycles, drafts accepted, lookup
cycles, plain steps, tau, speedup against the plain decode) and the cycles one line each.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_prompt


def traced(decoder) -> list[dict]:
    """Record every cycle the decoder's policy observes (the policy object may be replaced between
    runs: the hook is put on the one in place)."""
    cycles: list[dict] = []
    policy = decoder.policy
    observe = policy.observe

    def hook(record):
        observe(record)
        evidence = getattr(policy, "evidence", None)
        cycles.append({
            "drafted": record.drafted, "probe": record.plan.probe, "width": record.width,
            "sources": list(record.choice.sources), "verified": list(record.verified),
            "accepted": list(record.accepted), "k": record.choice.k,
            "expected": record.choice.expected,
            "draft_ms": 1000 * record.draft_seconds, "verify_ms": 1000 * record.verify_seconds,
            "host_ms": 1000 * record.host_seconds,
            "evidence_mean": None if evidence is None else round(evidence.mean(), 3),   # the draft's gain, plain steps
            "plain_left": policy.fallback.left,                                           # fallback steps to come
        })
    policy.observe = hook
    return cycles


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompt", required=True)
    p.add_argument("--proposer", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--speculate", default="auto")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pipe = load_decoder("smollm2", dtype=args.dtype, speculate=args.speculate, proposer=args.proposer)
    ids = encode_prompt(pipe.tokenizer, args.prompt)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(pipe.stop_token_ids))
    plain = pipe.decoder.variant(speculate="never")
    for decoder in (plain, pipe.decoder):   # untimed warm-up, as --compare does
        decoder.generate([ids], GenerationConfig(max_new_tokens=8))
    report = []
    for run in range(args.runs):
        decoder = pipe.decoder.variant()     # same costs, nothing learned of the draft
        cycles = traced(decoder)
        clock, cpu = time.perf_counter(), time.process_time()
        [result] = decoder.generate([ids], config)
        spec_s, spec_cpu = time.perf_counter() - clock - result.timing.prefill_seconds, time.process_time() - cpu
        clock, cpu = time.perf_counter(), time.process_time()
        [base] = plain.generate([ids], config)
        plain_s, plain_cpu = time.perf_counter() - clock - base.timing.prefill_seconds, time.process_time() - cpu
        # bfloat16 passes of other shapes may legitimately flip a near-tie (docs/spec.md §3); float32 may not
        assert args.dtype != "float32" or base.tokens == result.tokens, "speculative output differs from plain decoding"
        drafted = [c for c in cycles if c["drafted"]]
        summary = {
            "run": run, "new_tokens": result.stats.new_tokens, "identical": base.tokens == result.tokens, "speedup": (plain_s / base.stats.new_tokens) /
            (spec_s / result.stats.new_tokens), "tau": result.stats.as_dict().get("acceptance_length"),
            "speedup_cpu": plain_cpu / spec_cpu,   # process CPU time, prefill included: a shared host's waits excluded
            "cycles": len(cycles), "draft_cycles": len(drafted), "draft_probes": sum(c["probe"] for c in drafted),
            "drafts_verified": sum(sum(n for n, s in zip(c["verified"], c["sources"]) if s == "draft") for c in cycles),
            "accepted_by_source": result.stats.accepted_by_source,
            "lookup_cycles": sum("lookup" in c["sources"] for c in cycles),
            "tree_cycles": sum("tree" in c["sources"] for c in cycles),
            "plain_steps": sum(not c["drafted"] and c["width"] == 1 for c in cycles),
            "draft_ms": sum(c["draft_ms"] for c in cycles), "spec_ms": 1000 * spec_s, "plain_ms": 1000 * plain_s,
            "plain_step_ms": 1000 * plain_s / max(base.stats.new_tokens - 1, 1),
        }
        report.append({"summary": summary, "cycles": cycles, "text": pipe.tokenizer.decode(result.tokens)})
        print(json.dumps(summary))
        for i, c in enumerate(cycles):
            print(f"  {i:3d} {'D' if c['drafted'] else '-'}{'p' if c['probe'] else ' '} w={c['width']} "
                  f"src={','.join(c['sources']) or '-':8s} ver={c['verified']} acc={c['accepted']} "
                  f"exp={c['expected']:.2f} draft={c['draft_ms']:.1f} verify={c['verify_ms']:.1f} "
                  f"host={c['host_ms']:.1f} gain={c['evidence_mean']} fallback={c['plain_left']}")
    print(report[-1]["text"])
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
