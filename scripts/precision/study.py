"""Precision study of issue 44 (docs/precision.md): greedy mismatches, near-tie bound, step costs.

    python scripts/precision/study.py mismatch --out runs/precision/mismatch.json [--max-new-tokens 128]
    python scripts/precision/study.py bound    --out runs/precision/bound.json
    python scripts/precision/study.py cost     --out runs/precision/cost.json [--repeats 15] [--batch 1,8]

`mismatch`: the 24 prompts of scripts/precision/prompts (six kinds, four each), T=0, batch 1, the
default target in --dtype (default bfloat16): plain decoding and the speculative decoders (hybrid,
the draft alone) under three numerics: `model` (the LM head at the model's precision: before
issue 44), `float32` (decoding.verifier.full_logits, the default now) and `exact` (float32 logits and
--exact-verify, whose plain decoding runs its attention too). Each speculative output is compared
with plain decoding under the same numerics and every mismatch classified by eval.audit (float32
target margin at the first divergence).
`bound`: how far a decoding's difference of two logits strays from the float32 target's, for the
float32 target's top two tokens at every position of the plain outputs: one-token steps and 8-token
verify passes, teacher-forced, in --dtype with the model's head and with float32 logits; the
quantiles and the largest.
`cost`: median, over paired interleaved repeats in one process (CPU clock), of a plain step (q=1)
and an 8-token verify pass at a ~300-token context (rows 10 tokens apart at --batch above 1), for
each numerics and for a float32 head over the whole vocabulary (a float32 copy of the weight: the
alternative not shipped); `exact_verify_paired_ratio`: `exact` against `float32` (what
--exact-verify adds).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dflash2.data.prompts import load_conversations
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.decoding.verifier.full_logits import direct
from dflash2.eval.audit import Reference, audit
from dflash2.pipeline import load_decoder
from dflash2.targets import exact_attention
from dflash2.targets.builtin import load_target_model
from dflash2.targets.chat import encode_messages

PROMPTS = Path(__file__).resolve().parent / "prompts"
KINDS = ("summarise", "document", "translate", "qa", "math", "chat")
NUMERICS = ("model", "float32", "exact")


PER_KIND = [4]


def prompts(tokenizer) -> dict[str, list[list[int]]]:
    files = [str(PROMPTS / f"{kind}.jsonl") for kind in KINDS]
    conversations = load_conversations([], PER_KIND[0], files)
    return {name: [encode_messages(tokenizer, [{"role": "user", "content": c.turns[0]}]) for c in convs]
            for name, convs in conversations.items()}


def set_numerics(target, numerics: str) -> None:
    """The adapter's numerics for a study arm (the model head: before issue 44); `exact` as
    `--exact-verify` computes (its head's product too), the cache kept as loaded."""
    target.full_logits.active = numerics != "model"
    target.exact_verify = numerics == "exact"
    target.full_logits.multiply = exact_attention.product if numerics == "exact" else direct
    if numerics == "exact":
        exact_attention.install_invariant_products(target.model)


def mismatch(args) -> dict:
    pipe = load_decoder("smollm2", dtype=args.dtype, proposer="hybrid")
    target = pipe.decoder.target
    decoders = {"hybrid": pipe.decoder, "draft": pipe.decoder_for("draft")}   # one target adapter, shared
    plain = SpeculativeDecoder(target)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(pipe.stop_token_ids))
    sets = prompts(pipe.tokenizer)
    reference = Reference(load_target_model(pipe.target_files, pipe.device, torch.float32))
    out = {"dtype": pipe.precision.name, "max_new_tokens": args.max_new_tokens, "arms": {}}
    outputs: dict[str, dict] = {}
    arms = [n for n in NUMERICS if n in args.numerics.split(",")]
    for numerics in arms:
        set_numerics(target, numerics)
        for name in ["plain", *decoders]:
            decoder = plain if name == "plain" else decoders[name]
            tokens, seconds, produced = {}, 0.0, 0
            for kind, ids in sets.items():
                for i, prompt in enumerate(ids):
                    start = time.perf_counter()
                    result = decoder.generate([prompt], config)[0]
                    seconds += time.perf_counter() - start
                    produced += len(result.tokens)
                    tokens[f"{kind}/{i}"] = result.tokens
            outputs[f"{numerics}/{name}"] = tokens
            print(f"# {numerics}/{name}: {produced / seconds:.1f} tok/s", file=sys.stderr, flush=True)
            out["arms"][f"{numerics}/{name}"] = {"tokens_per_second": produced / seconds}
    for numerics in arms:
        base = outputs[f"{numerics}/plain"]   # exact: plain decoding under --exact-verify (its own attention)
        for name in decoders:
            arm = f"{numerics}/{name}"
            pairs = [(sets[key.split("/")[0]][int(key.split("/")[1])], base[key], outputs[arm][key]) for key in base]
            found = audit(pairs, lambda: reference, out["dtype"])
            out["arms"][arm]["audit"] = found.to_dict()
            print(f"# {arm}: {found.line()}", file=sys.stderr, flush=True)
    if {"model", "float32"} <= set(arms):
        out["plain_changed_by_float32_logits"] = sum(outputs["model/plain"][k] != outputs["float32/plain"][k]
                                                     for k in outputs["model/plain"])
    return out


def bound(args) -> dict:
    pipe = load_decoder("smollm2", dtype=args.dtype, no_draft=True)
    target = pipe.decoder.target
    reference = load_target_model(pipe.target_files, pipe.device, torch.float32)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(pipe.stop_token_ids))
    errors = {f"{numerics}/{path}": [] for numerics in ("model", "float32") for path in ("step", "verify8")}
    for ids in [p for group in prompts(pipe.tokenizer).values() for p in group]:
        set_numerics(target, "float32")
        output = pipe.decoder.generate([ids], config)[0].tokens
        sequence = ids + output
        with torch.inference_mode():   # z32[j]: the float32 target's logits for output[j]
            z32 = reference(input_ids=torch.tensor([sequence]), logits_to_keep=0).logits[0, len(ids) - 1:-1].float()
        top2 = z32.topk(2, dim=-1).indices
        a, b, rows = top2[:, 0], top2[:, 1], torch.arange(len(output))
        for numerics in ("model", "float32"):
            set_numerics(target, numerics)
            for path, q in (("step", 1), ("verify8", 8)):
                first, _ = target.prefill([ids])
                logits, feed = [first[0]], output[:-1]             # teacher-forced: output[j] predicts j + 1
                for start in range(0, len(feed), q):
                    chunk = feed[start:start + q]
                    step, _ = target.step(torch.tensor([chunk]))
                    target.keep(torch.tensor([len(chunk)]), len(chunk))
                    logits.append(step[0])
                target.reset()
                z = torch.cat(logits)
                errors[f"{numerics}/{path}"] += ((z[rows, a] - z[rows, b]) - (z32[rows, a] - z32[rows, b])).abs().tolist()
    def quantiles(values):
        values = sorted(values)
        return {"positions": len(values), "median": statistics.median(values),
                "p99": values[int(0.99 * (len(values) - 1))], "p999": values[int(0.999 * (len(values) - 1))],
                "max": values[-1]}
    return {"dtype": pipe.precision.name, "errors": {path: quantiles(v) for path, v in errors.items()}}


def cost(args) -> dict:
    torch.set_num_threads(args.threads)
    pipe = load_decoder("smollm2", dtype=args.dtype, no_draft=True)
    target = pipe.decoder.target
    exact_target = TargetAdapter(target.model, exact_verify=True)   # its own cache (float32 keys and values)
    weight32 = target.model.get_output_embeddings().weight.float()
    pool = [p for group in prompts(pipe.tokenizer).values() for p in group]
    arms = {"model": "model", "float32_refined": "float32", "exact": "exact", "float32_full_head": "model"}
    batches = [int(b) for b in args.batch.split(",")]
    times = {f"{arm}/b{b}/q{q}": [] for arm in arms for b in batches for q in (1, 8)}
    head = target.model.get_output_embeddings()
    for b in batches:   # rows of ~300 tokens, 10 apart: left padding as in a real batch
        for adapter in (target, exact_target):
            adapter.prefill([(pool[i] * 4)[:300 - 10 * i] for i in range(b)])
        for _ in range(args.repeats):
            for arm, numerics in arms.items():
                adapter = exact_target if numerics == "exact" else target
                set_numerics(adapter, numerics)
                if arm == "float32_full_head":
                    head.forward = lambda x: F.linear(x.float(), weight32)
                for q in (1, 8):
                    start = time.process_time()      # CPU clock: the host is shared
                    adapter.step(torch.tensor([list(range(1000, 1000 + q))] * b))
                    times[f"{arm}/b{b}/q{q}"].append(time.process_time() - start)
                    adapter.keep(torch.zeros(b, dtype=torch.long), q)      # dropped: the context stays the same
                if arm == "float32_full_head":
                    del head.forward
        for adapter in (target, exact_target):
            adapter.reset()

    def paired(arm, base, key):
        return statistics.median([x / y for x, y in zip(times[f"{arm}/{key}"], times[f"{base}/{key}"])])
    keys = [f"b{b}/q{q}" for b in batches for q in (1, 8)]
    return {"dtype": pipe.precision.name, "threads": args.threads, "context": 300, "repeats": args.repeats,
            "clock": "process CPU time", "median_ms": {k: 1000 * statistics.median(v) for k, v in times.items()},
            "paired_ratio_to_model_head": {f"{arm}/{k}": paired(arm, "model", k) for arm in arms for k in keys},
            "exact_verify_paired_ratio": {k: paired("exact", "float32_refined", k) for k in keys}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("mismatch", "bound", "cost"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", default="1", help="cost: the batch sizes, comma-separated (e.g. 1,8)")
    parser.add_argument("--numerics", default="model,float32",
                        help="mismatch: the numerics to compare (of model, float32, exact), each against plain decoding under it")
    parser.add_argument("--per-kind", type=int, default=4, help="prompts of each kind (a quick check: 1)")
    args = parser.parse_args()
    PER_KIND[0] = args.per_kind
    torch.set_num_threads(args.threads)
    result = {"mismatch": mismatch, "bound": bound, "cost": cost}[args.what](args)
    result["command"] = " ".join(sys.argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "arms"}, indent=1)[:3000])


if __name__ == "__main__":
    main()
