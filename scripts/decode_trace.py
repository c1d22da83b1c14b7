"""Every choice the speculation policy makes in whole decodes of the default target, on a fixed clock.

    PYTHONPATH=src:tests python scripts/decode_trace.py --out trace.json[.gz] [--check tests/fixtures/decode_trace.json.gz]

Decodes a few prompts of the shipped benchmark sets with SmolLM2 and its shipped draft, for the
proposers draft, lookup and hybrid, greedy and sampled, one row and three, with the wall clock
replaced by a fixed one: a target pass of b rows and q tokens a row takes 30 ms + 2 ms * b +
1.5 ms * b * q, a draft pass 12 ms + 1 ms * b, everything else nothing (so the cost model, its
start-up calibration included, sees the same figures on every machine, and the policy's choices
depend only on the model's tokens). Writes per decode the cycles' choices (tests/policy_trace.py's
`cycle_of`) and the tokens (`--out` ending in .gz: gzip -9 with no name or time, the fixture's form);
`--check` compares them with a recorded trace and exits 1 on a difference. The fixture,
tests/fixtures/decode_trace.json.gz, is main at 2d7a917 (hybrid's outlook of the draft a slow
average: the hybrid decodes changed, the draft and lookup ones are as recorded at 807cc69): re-record
it, from an unchanged tree, when the model or the decoder's tokens change or the policy's behaviour
changes on purpose (measured), never to make a refactor pass. A few minutes on one CPU thread.
The decodes run at the default precision (bfloat16 where the CPU has it), whose tokens depend on
the CPU's kernels: the fixture was recorded on an Intel Xeon with AMX, and on an AMD EPYC without
AMX every decode differs from it. On another machine, compare a change against a trace of its base
made on the same machine (`--out` from each, then `--check` one against the other).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time

import torch

FAKE_NOW = [0.0]


def fake_perf_counter() -> float:
    return FAKE_NOW[0]


def advance(seconds: float) -> None:
    FAKE_NOW[0] += seconds


def install_clock() -> None:
    from dflash2.decoding.proposers.draft import DraftProposer
    from dflash2.decoding.verifier.adapter import TargetAdapter

    time.perf_counter = fake_perf_counter
    for cls, name in ((TargetAdapter, "step"), (TargetAdapter, "step_tree")):
        original = getattr(cls, name)

        def timed(self, ids, *args, _original=original):
            advance(0.030 + 0.002 * ids.shape[0] + 0.0015 * ids.shape[0] * ids.shape[1])
            return _original(self, ids, *args)
        setattr(cls, name, timed)
    propose = DraftProposer.propose

    def timed_propose(self, anchors, *args, **kwargs):
        advance(0.012 + 0.001 * anchors.shape[0])
        return propose(self, anchors, *args, **kwargs)
    DraftProposer.propose = timed_propose


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--check", default=None, help="a recorded trace (.json or .json.gz)")
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    os.environ.setdefault("DFLASH2_CACHE", os.path.join(tempfile.gettempdir(), "dflash2-trace-cache"))
    os.environ["DFLASH2_RECALIBRATE"] = "1"         # the start-up calibration is measured on the fixed clock
    torch.set_num_threads(1)
    from policy_trace import cycle_of

    from dflash2.data.prompts import load_conversations
    from dflash2.decoding.loop.engine import GenerationConfig
    from dflash2.pipeline import load_decoder
    from dflash2.targets.chat import encode_messages

    pipe = load_decoder("smollm2", proposer="hybrid")
    install_clock()
    convs = load_conversations(["gsm8k", "humaneval", "mt-bench"], 2, ["src/dflash2/data/benchmarks/grounded.jsonl"])
    prompts = [encode_messages(pipe.tokenizer, [{"role": "user", "content": c.turns[0]}])
               for cs in convs.values() for c in cs[:2]]
    trace = {}
    for proposer in ("draft", "lookup", "hybrid"):
        own = pipe.decoder_for(proposer)
        for temperature in (0.0, 1.0):
            for batch in (1, 3):
                decoder = own.variant()          # the same cost model, nothing learnt of the proposers
                cycles = []
                observe = decoder.policy.observe

                def recording(record, _observe=observe, _policy=decoder.policy, _cycles=cycles):
                    _observe(record)
                    _cycles.append(cycle_of(record, record.drafted, _policy.fallback.left))
                decoder.policy.observe = recording
                config = GenerationConfig(max_new_tokens=args.tokens, temperature=temperature, top_p=0.95, top_k=20,
                                          seed=7, stop_token_ids=pipe.stop_token_ids)
                tokens = []
                for i in range(0, len(prompts), batch):
                    tokens += [r.tokens for r in decoder.generate(prompts[i:i + batch], config)]
                name = f"{proposer}-T{temperature:g}-b{batch}"
                trace[name] = {"cycles": cycles, "tokens": tokens}
                print(name, len(cycles), "cycles,", sum(c[2] for c in cycles), "drafted,",
                      sum(1 for c in cycles if c[-1]), "in fallback", flush=True)
    if args.out.endswith(".gz"):                    # the fixture's form: gzip -9, no name or time in the header
        with open(args.out, "wb") as handle:
            handle.write(gzip.compress(json.dumps(trace).encode("utf-8"), compresslevel=9, mtime=0))
    else:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(trace, handle)
    if args.check:
        with (gzip.open if args.check.endswith(".gz") else open)(args.check, "rt", encoding="utf-8") as handle:
            recorded = json.load(handle)
        different = [name for name in recorded if recorded[name] != trace.get(name)]
        print("identical" if not different else f"DIFFERENT: {', '.join(different)}")
        return 1 if different else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
