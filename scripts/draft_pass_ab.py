"""Paired timing of the draft pass against a plain target step, in one process.

Usage: PYTHONPATH=src python scripts/draft_pass_ab.py [--dtype bfloat16] [--threads 1] [--rounds 40]
       [--sizes 0,16384,8192] [--forms int8,int4] [--batch 1] [--before REV] [--draft DIR] [--data DIR ...]
       [--clock cpu|wall] [--profile]

One target (smollm2) at `--dtype` and the draft in the same dtype, one chat prompt prefilled in
`--batch` rows (every pass below then runs that many rows).
Each round runs, interleaved: one plain target step (one token, rolled back), one verify pass of a
whole block (8 tokens, rolled back) and one draft pass (`DraftProposer.propose`: backbone, LM head,
path selector) per variant:
- `V=N`: this checkout's draft with a frequency-ranked draft vocabulary of N tokens (0: the draft's
  own vocabulary), built in memory from `--data` as `python -m dflash2.training.revocab` does;
- `FORM`: with `--forms int8,int4`, a copy of this checkout's draft whose inference copies of its
  projections (`model.packing`) are weight-only quantized (`model.quantized`) instead of oneDNN's
  packed bfloat16 layout (a draft's proposals only: verification is untouched);
- `before`: with `--before REV`, the draft pass of commit REV (its `dflash2` package exported by
  `git archive` and imported under another name; the flat layout before issue 43 or the current
  one), same weights, the checkpoint's own vocabulary.
`--clock cpu` (default) times process CPU seconds (one torch thread: the work itself, not the
waits of a shared host); `--clock wall` wall seconds. Prints for the verify pass and per variant the median ms
and its ratio to the median plain step; `--profile` adds torch.profiler tables of each variant and
its count of operations (top-level, in all, matmuls) per call.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from dflash2.decoding.proposers.draft import DraftProposer
from dflash2.decoding.loop.timing import Stopwatch
from dflash2.model import packing
from dflash2.pipeline import load_decoder, shipped_draft_path
from dflash2.targets.chat import encode_prompt
from dflash2.training.revocab import response_sequences, revocabulary

PROMPT = "Explain in three sentences why the sky is blue."


def before_package(rev: str, into: Path) -> str:
    """Export src/dflash2 of `rev` as package `dflash2_before` under `into`; returns its name."""
    data = subprocess.run(["git", "archive", rev, "src/dflash2"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            path = into / "dflash2_before" / Path(member.name).relative_to("src/dflash2")
            path.parent.mkdir(parents=True, exist_ok=True)
            content = tar.extractfile(member).read()
            if member.name.endswith(".py"):
                content = re.sub(rb"\bdflash2(?=[. ])", b"dflash2_before", content)
            path.write_bytes(content)
    sys.path.insert(0, str(into))
    return "dflash2_before"


def _first_module(package: str, *names: str):
    """The first of `package.name` that imports (module paths moved between layouts)."""
    for name in names:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{name}":
                raise
    raise ModuleNotFoundError(f"none of {names} in {package}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sizes", default="0,16384,8192")
    parser.add_argument("--forms", default="", help="quantized forms of the draft's projections to time beside")
    parser.add_argument("--batch", type=int, default=1, help="rows of the prompt prefilled")
    parser.add_argument("--before", default=None, help="a git revision whose draft pass to time beside")
    parser.add_argument("--draft", default=None, help="draft directory (default: the shipped one)")
    parser.add_argument("--data", action="append", default=None)
    parser.add_argument("--clock", default="cpu", choices=("cpu", "wall"))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    pipe = load_decoder("smollm2", args.draft, dtype=args.dtype, draft_dtype=args.dtype, proposer="draft")
    adapter, draft = pipe.decoder.target, pipe.decoder.draft
    embed, head = adapter.model.get_input_embeddings().weight, adapter.model.get_output_embeddings().weight
    ids = encode_prompt(pipe.tokenizer, PROMPT)
    _, features = adapter.prefill([ids] * args.batch)
    sizes = [int(s) for s in args.sizes.split(",")]
    data = args.data or ["data/regen/smollm2-sharegpt", "data/regen/smollm2-synthetic"]
    sequences, stops = response_sequences(data) if any(sizes) else ([], set())
    variants = {}
    for size in sizes:
        other = draft if size == 0 else revocabulary(draft.float(), sequences, size, stops)[0].eval()
        other.to(dtype).bind_target(embed, head)
        variants[f"V={size or draft.config.draft_vocab_size or draft.config.vocab_size}"] = DraftProposer(other, Stopwatch(None))
    draft.to(dtype)
    for form in [f for f in args.forms.split(",") if f]:
        other, packed_form = copy.deepcopy(draft), packing.default_form
        packing.default_form = lambda weight: form            # only while this copy packs its projections
        try:
            other.pack()
        finally:
            packing.default_form = packed_form
        variants[form] = DraftProposer(other, Stopwatch(None))
    if args.before:
        name = before_package(args.before, Path(tempfile.mkdtemp(prefix="draft-before-")))
        old_draft = importlib.import_module(f"{name}.model.draft").DFlash2DraftModel
        old_proposer = _first_module(name, "decoding.proposers.draft", "decoding.proposer").DraftProposer
        old_stopwatch = _first_module(name, "decoding.loop.timing", "decoding.timing").Stopwatch
        old = old_draft.from_pretrained(args.draft or shipped_draft_path("smollm2"), dtype=dtype)
        old.bind_target(embed, head)
        variants[f"before ({args.before})"] = old_proposer(old, old_stopwatch(None))
    for proposer in variants.values():
        proposer.add_rows(features, adapter.mask)
    rows = args.batch
    anchors = torch.tensor([ids[-1]] * rows)
    start = adapter.next_position.clone()
    block = draft.config.block_size
    fresh = torch.tensor([[ids[-1]]] * rows)
    none_kept = torch.zeros(rows, dtype=torch.long)

    def plain() -> None:   # one plain target step of one token, rolled back (the cache keeps its length)
        adapter.step(fresh)
        adapter.keep(none_kept, 1)

    block_ids = torch.tensor([ids[-block:]] * rows)

    def verify() -> None:   # one verify pass of a whole block (`block` tokens), rolled back
        adapter.verify(block_ids)
        adapter.keep(none_kept, block)

    runs = {"plain step": plain, f"verify {block}": verify,
            **{name: (lambda p=p: p.propose(anchors, start, block, 0.0)) for name, p in variants.items()}}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(3):   # warm-up
        for fn in runs.values():
            fn()
    for _ in range(args.rounds):
        for name, fn in runs.items():
            t = clock()
            fn()
            samples[name].append(clock() - t)
    plain_ms = 1000 * statistics.median(samples["plain step"])
    print(f"dtype {args.dtype}, batch {rows}, {args.threads} thread(s), {args.rounds} rounds, {args.clock} clock; "
          f"plain step median {plain_ms:.2f} ms")
    print("| pass | ms (median) | / plain step |\n|---|---:|---:|")
    for name in [f"verify {block}", *variants]:
        ms = 1000 * statistics.median(samples[name])
        print(f"| {name} | {ms:.2f} | {ms / plain_ms:.3f} |")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        for name, fn in runs.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    fn()
            events = prof.events()
            matmuls = sum(e.name in ("aten::mm", "aten::bmm", "mkldnn::_linear_pointwise") for e in events)
            print(f"\n## {name}: torch.profiler, 10 calls; per call {sum(e.cpu_parent is None for e in events) / 10:.0f} "
                  f"top-level operations, {len(events) / 10:.0f} in all, {matmuls / 10:.0f} matmuls")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
