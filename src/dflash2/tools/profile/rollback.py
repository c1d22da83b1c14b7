"""`python -m dflash2.tools.profile.rollback`: what rolling back a hybrid target's recurrent state costs.

Contract: on one target (a hybrid: `decoding/verifier/recurrent.py`), for each batch size b, a batch of b
prompts is prefilled and then `--repeats` verify cycles are timed, each a step of `--block` tokens
followed by `keep(counts)` with counts drawn uniformly from 1..block per row (rows roll back to
different positions). Reported medians, milliseconds: the verify step with per-position capture
(the engine's), the same step with the model's own kernels and no capture (what an attention-only
roll-back would need), `keep` in all, the recurrent layers' part of it, and a plain one-token step.
`rollback share` = (recurrent keep + capture overhead) / (verify + keep): the share of a cycle's
target work that the roll-back adds (the draft's pass, absent here, only makes a real cycle longer,
so the share of a whole cycle is smaller). `verify / plain` = verify (capture) / plain step: what a
verify pass costs in one-token steps. An attention-only target runs too (nothing to capture or roll
back: its verify / plain ratio is the one to set beside a hybrid's of similar size). Prints a markdown
table naming which kernels were importable; `--json` writes the rows.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from dflash2.argparsing import first_paragraph
from dflash2.targets import delta_rule
from dflash2.files.atomic import write_json
from dflash2.errors import require
from dflash2.pipeline import load_decoder


@dataclass
class RollbackCost:
    target: str
    kind: str                   # "hybrid" or "attention only"
    batch: int
    block: int
    verify_ms: float            # step of `block` tokens, capturing each position's state
    verify_no_capture_ms: float  # the same step with the model's own kernels
    keep_ms: float
    recurrent_keep_ms: float
    plain_step_ms: float
    rollback_share: float
    verify_over_plain: float


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - start)


def measure(adapter, name: str, prompts: list[list[int]], block: int, repeats: int, seed: int = 0) -> RollbackCost:
    b = len(prompts)
    g = torch.Generator().manual_seed(seed)
    adapter.prefill(prompts)
    samples: dict[str, list[float]] = {k: [] for k in ("verify", "plain", "no_capture", "keep", "recurrent")}
    for _ in range(repeats + 1):                                   # the first round warms up
        ids = torch.randint(3, min(1000, adapter.vocab_size), (b, block), generator=g).to(adapter.device)
        counts = torch.randint(1, block + 1, (b,), generator=g).to(adapter.device)
        no_capture = float("nan")
        if adapter.recurrent:                                      # attention only: nothing to capture
            no_capture = _timed(lambda: _step_without_capture(adapter, ids))
            adapter.keep(torch.full((b,), block, device=adapter.device), block)  # nothing captured: all kept
        verify = _timed(lambda: adapter.step(ids))
        timers = []
        layers = list(adapter.recurrent)
        keep_total = _timed(lambda: _keep_timing(adapter, layers, counts, block, timers))
        plain = _timed(lambda: adapter.step(ids[:, :1]))
        adapter.keep(torch.ones(b, dtype=torch.long, device=adapter.device), 1)
        for key, value in (("verify", verify), ("plain", plain), ("no_capture", no_capture), ("keep", keep_total),
                           ("recurrent", sum(timers))):
            samples[key].append(value)
    med = {k: statistics.median(v[1:]) for k, v in samples.items()}
    capture = med["verify"] - med["no_capture"] if adapter.recurrent else 0.0
    added = med["recurrent"] + max(capture, 0.0)
    kind = "hybrid" if adapter.hybrid else "attention only"
    return RollbackCost(name, kind, b, block, med["verify"], med["no_capture"], med["keep"], med["recurrent"], med["plain"],
                        added / (med["verify"] + med["keep"]), med["verify"] / med["plain"])


def _step_without_capture(adapter, ids) -> None:
    layers, adapter.recurrent = adapter.recurrent, []
    try:
        adapter.step(ids)
    finally:
        adapter.recurrent = layers


def _keep_timing(adapter, layers, counts, block, timers) -> None:
    """`adapter.keep` with the recurrent layers' part timed on its own."""
    originals = [layer.keep for layer in layers]
    for layer, original in zip(layers, originals):
        layer.keep = lambda c, original=original: timers.append(_timed(lambda: original(c)))
    try:
        adapter.keep(counts, block)
    finally:
        for layer in layers:
            del layer.keep


def render(rows: list[RollbackCost], header: str) -> str:
    lines = [header, "", "| target | batch | block | verify (capture) | verify (no capture) | keep | recurrent keep "
             "| plain step | rollback share | verify / plain |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.target} ({r.kind}) | {r.batch} | {r.block} | {r.verify_ms:.1f} | {r.verify_no_capture_ms:.1f} | {r.keep_ms:.2f} | "
                     f"{r.recurrent_keep_ms:.2f} | {r.plain_step_ms:.1f} | {100 * r.rollback_share:.1f} % | "
                     f"{r.verify_over_plain:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash2.tools.profile.rollback", description=first_paragraph(__doc__))
    parser.add_argument("--target", required=True, help="local HF dirs or built-in names, comma-separated (hybrids, "
                        "or attention-only targets for their verify / plain ratio); each batch size runs on each in turn")
    parser.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--block", type=int, default=8, help="tokens a verify pass runs per row")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="the longest prompt (the shortest: half)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each measurement (medians)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    parser.add_argument("--dtype", default="float32", help="the targets' dtype")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batch.split(",") if b.strip()]
    require(batches and all(b > 0 for b in batches), f"--batch: positive integers, got '{args.batch}'")
    require(args.block >= 2 and args.repeats >= 1, "--block must be >= 2 and --repeats >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    targets = [t.strip() for t in args.target.split(",") if t.strip()]
    adapters = {t: load_decoder(t, None, args.device, args.dtype, speculate="never").decoder.target for t in targets}
    g = torch.Generator().manual_seed(1)
    high = min(1000, *(a.vocab_size for a in adapters.values()))       # token ids every target has
    rows = []
    for b in batches:
        lengths = torch.randint(args.prompt_tokens // 2, args.prompt_tokens + 1, (b,), generator=g).tolist()
        prompts = [torch.randint(3, high, (n,), generator=g).tolist() for n in lengths]
        for name, adapter in adapters.items():                   # the same prompts, one target after the other
            rows.append(measure(adapter, name, prompts, args.block, args.repeats))
            adapter.reset()
    kernels = ", ".join(f"{name} {'importable' if ok else 'not importable'}" for name, ok in delta_rule.fast_kernels().items())
    print(render(rows, f"Roll-back cost [{args.dtype}, {args.device}, {kernels}], ms (medians of {args.repeats})"))
    if args.json:
        write_json(args.json, [asdict(r) for r in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
