"""`dflash2 yardstick`: the fixed, fast measurement of a draft recipe: real acceptance length.

Contract:
- Real, not teacher-forced: the draft and the target decode together (`--speculate always`, so
  every cycle verifies the whole block and tau measures the draft alone, not the length policy),
  at T=0 and at the official T=1 (top-p 0.95, top-k 20), on a fixed prompt set:
  - the held-out split of the regenerated training data (`dflash2.data.holdout`: records no recipe
    with `data.exclude_holdout` trains on), the first `heldout` of each data directory in a fixed
    hash order, their stored prompts (already chat-encoded);
  - `per_benchmark` prompts of each of the five benchmarks, taken from record 100 on, so they do
    not overlap the 20 prompts per dataset of the full protocol.
  The set is frozen on first use into `--prompts` (a JSON file of sources and token ids) and read
  back from there afterwards, so every arm is measured on the same prompts however the data
  directories grow.
- `measure(pipe, settings)` -> `YardstickResult`: tau per temperature (pooled: tokens committed by
  verification / verification passes; at T=1 over `t1_seeds` sampled runs of each prompt, seeds
  `seed`, `seed + 1`, ...: one run of 24 prompts moves tau by up to 0.15) overall and per source,
  the draft-pass milliseconds per cycle (what a smaller LM head buys), cycles and tokens;
  `extra["position_acceptance"]`: per temperature, the share of cycles whose drafts 1..k were all
  accepted, k = 1..B-1.
- `main(argv)` measures each `--draft` (a DFlash draft, or an MTP head: `--proposer mtp`, the same
  yardstick), prints one line per draft and appends a row to
  `--table` (markdown) and its `.jsonl` twin: arm name, training budget read from the run's
  `summary.json` when the draft is a run's `final/` (steps, tokens, CPU seconds), tau at T=0 and
  T=1, per-source tau, draft ms per cycle, the target's precision (`--dtype`, default `auto`:
  `devices.resolve_precision`; rows written before it was recorded ran float32), commit and
  machine. Bad input (`--device` this torch or machine lacks included): one line, exit 2.
"""
from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path

import torch

from dflash2.data.holdout import is_held_out
from dflash2.data.prompts import BENCHMARKS, load_benchmark
from dflash2.argparsing import OneLineParser, add_device_arguments, add_recalibrate_argument, apply_recalibrate
from dflash2.runtime.devices import settle
from dflash2.runtime.machine import announce_threads, use_threads, warn_if_busy
from dflash2.data.shards import load_manifest, read_records
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.decoding.proposers.draft import DRAFT_PHASES
from dflash2.decoding.proposers.kinds import model_proposer
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_write, require_writable
from dflash2.model.families import family_of, load_draft
from dflash2.pipeline import load_decoder
from dflash2.runtime.provenance import cpu_model, git_commit, machine_identity
from dflash2.targets.chat import encode_messages

TEMPERATURES = {"t0": dict(temperature=0.0), "t1": dict(temperature=1.0, top_p=0.95, top_k=20)}
BENCH_OFFSET = 100


@dataclass(frozen=True)
class YardstickSettings:
    data_dirs: tuple[str, ...]
    heldout: int = 12                 # held-out prompts per data directory
    per_benchmark: int = 2            # benchmark prompts per dataset (records 100..)
    max_new_tokens: int = 96
    batch_size: int = 8
    seed: int = 0
    t1_seeds: int = 1                 # sampled runs of each prompt at T=1 (seeds seed, seed + 1, ...), pooled


@dataclass
class YardstickResult:
    tau: dict[str, float]                          # temperature -> pooled tau
    tau_by_source: dict[str, dict[str, float]]     # temperature -> source -> tau
    draft_ms_per_cycle: float
    cycles: int
    new_tokens: int
    prompts: int
    seconds: float
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Prompt:
    source: str
    tokens: list[int]


def yardstick_prompts(tokenizer, settings: YardstickSettings) -> list[Prompt]:
    prompts: list[Prompt] = []
    for directory in settings.data_dirs:
        held = [r for r in read_records(directory) if is_held_out(r.id)]
        held.sort(key=lambda r: zlib.crc32(r.id.encode()))
        require(len(held) >= 1, f"'{directory}' has no held-out records yet (one in 64 is held out)")
        prompts += [Prompt(Path(directory).name, r.prompt.tolist()) for r in held[:settings.heldout]]
    for name in BENCHMARKS:
        convs = load_benchmark(name, BENCH_OFFSET + settings.per_benchmark)[BENCH_OFFSET:]
        prompts += [Prompt(name, encode_messages(tokenizer, [{"role": "user", "content": c.turns[0]}])) for c in convs]
    return prompts


def frozen_prompts(path: Path, tokenizer, settings: YardstickSettings) -> list[Prompt]:
    """The prompt set stored at `path`, written there first if it does not exist yet."""
    if not path.is_file():
        prompts = yardstick_prompts(tokenizer, settings)
        with atomic_write(path, "w") as handle:
            json.dump({"settings": asdict(settings), "prompts": [asdict(p) for p in prompts]}, handle)
    try:
        data = json.loads(path.read_text())
        return [Prompt(p["source"], list(p["tokens"])) for p in data["prompts"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DFlash2Error(f"--prompts '{path}' is not a yardstick prompt file: {error}") from None


def measure(pipe, settings: YardstickSettings, prompts: list[Prompt]) -> YardstickResult:
    decoder = pipe.decoder
    require(decoder.speculate == "always", "the yardstick measures the draft alone: build the decoder with speculate='always'")
    tau, by_source, positions, draft_seconds, cycles, tokens = {}, {}, {}, 0.0, 0, 0
    clock = time.perf_counter()
    for name, sampling in TEMPERATURES.items():
        seeds = range(settings.seed, settings.seed + (settings.t1_seeds if name == "t1" else 1))
        configs = [GenerationConfig(max_new_tokens=settings.max_new_tokens, stop_token_ids=tuple(pipe.stop_token_ids),
                                    seed=seed, **sampling) for seed in seeds]
        committed: dict[str, list[int]] = {}
        reached: list[int] = []                     # cycles whose drafts 1..k were all accepted, per k
        for config, start in product(configs, range(0, len(prompts), settings.batch_size)):
            chunk = prompts[start:start + settings.batch_size]
            results = decoder.generate([p.tokens for p in chunk], config)
            for prompt, result in zip(chunk, results):
                pair = committed.setdefault(prompt.source, [0, 0])
                pair[0] += sum(result.stats.committed_per_cycle)
                pair[1] += result.stats.cycles
                tokens += result.stats.new_tokens
                reached = [a + b for a, b in zip(reached or [0] * len(result.stats.accepted_at_position),
                                                 result.stats.accepted_at_position)]
            draft_seconds += sum(results[0].timing.phase_seconds.get(p, 0.0) for p in DRAFT_PHASES)
            cycles += results[0].timing.speculative_cycles
        total = [sum(v[0] for v in committed.values()), sum(v[1] for v in committed.values())]
        tau[name] = total[0] / total[1] if total[1] else 0.0
        by_source[name] = {s: v[0] / v[1] if v[1] else 0.0 for s, v in committed.items()}
        positions[name] = [n / total[1] if total[1] else 0.0 for n in reached]
    return YardstickResult(tau, by_source, 1000 * draft_seconds / max(cycles, 1), cycles, tokens, len(prompts),
                           time.perf_counter() - clock, {"position_acceptance": positions})


# --------------------------------------------------------------------------- table

def training_budget(draft_dir: Path) -> dict:
    """Steps, tokens and CPU seconds of the run whose `final/` this is (empty when unknown)."""
    summary = draft_dir.parent / "summary.json"
    if draft_dir.name != "final" or not summary.is_file():
        return {}
    data = json.loads(summary.read_text())
    return {k: data.get(k) for k in ("steps", "tokens", "cpu_seconds")}


def append_row(table: Path, row: dict) -> None:
    """Append `row` to the markdown table (header written once) and to its .jsonl twin, atomically."""
    jsonl = table.with_suffix(".jsonl")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()] if jsonl.is_file() else []
    rows.append(row)
    with atomic_write(jsonl, "w") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["# Recipe yardstick: real acceptance length of each arm", "",
             "Written by `dflash2 yardstick` (src/dflash2/eval/yardstick.py): real speculative decoding, whole "
             "block verified every cycle; held-out regenerated answers plus benchmark prompts from record 100 on.",
             "", "| arm | steps | tokens | CPU h | tau T=0 | tau T=1 | T=0 by source | draft ms/cycle | target dtype | "
             "commit | machine |",
             "|---|---:|---:|---:|---:|---:|---|---:|---|---|---|"]
    for r in rows:
        budget = r.get("budget", {})
        cpu = budget.get("cpu_seconds")
        sources = ", ".join(f"{k} {v:.2f}" for k, v in r["tau_by_source"]["t0"].items())
        seeds = r.get("settings", {}).get("t1_seeds", 1)
        t1 = f"{r['tau']['t1']:.3f}" + (f" ({seeds} seeds)" if seeds > 1 else "")
        lines.append(f"| {r['arm']} | {budget.get('steps', '')} | {budget.get('tokens', '')} | "
                     f"{'' if cpu is None else f'{cpu / 3600:.2f}'} | {r['tau']['t0']:.3f} | {t1} | "
                     f"{sources} | {r['draft_ms_per_cycle']:.1f} | {r.get('dtype', 'float32')} | {r['commit']} | "
                     f"{r['machine']} |")
    with atomic_write(table, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def parse_args(argv):
    p = OneLineParser(prog="dflash2 yardstick",
                                description="Real acceptance length of drafts on a fixed held-out + benchmark set.")
    p.add_argument("--draft", action="append", required=True, help="draft directory (repeat for several)")
    p.add_argument("--arm", action="append", default=None, help="name of each draft's recipe arm (default: its path)")
    p.add_argument("--target", default="smollm2")
    p.add_argument("--data", action="append", default=None,
                   help="regenerated data directory with held-out records (repeat; default: data/regen/smollm2-*)")
    p.add_argument("--table", default="docs/recipes/yardstick.md")
    p.add_argument("--prompts", default="docs/recipes/yardstick-prompts.json",
                   help="the frozen prompt set (written on first use)")
    p.add_argument("--heldout", type=int, default=12)
    p.add_argument("--per-benchmark", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--t1-seeds", type=int, default=1, help="sampled runs of each prompt at T=1, pooled (seeds 0, 1, ...)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice); "
                   "on a shared machine 1 thread can be far steadier")
    add_device_arguments(p, exact_verify=False, weights=False)
    add_recalibrate_argument(p)
    args = p.parse_args(argv)
    apply_recalibrate(args)
    args.device, _ = settle(args.device, args.dtype)
    for name in ("heldout", "per_benchmark", "max_new_tokens", "batch_size", "t1_seeds"):
        require(getattr(args, name) > 0, f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    announce_threads(args.threads)
    require(args.arm is None or len(args.arm) == len(args.draft), "give one --arm per --draft (or none)")
    table = Path(args.table)  # checked before minutes of measuring, like bench's --output
    require(not table.is_dir(), f"--table '{table}' is a directory; give a markdown file")
    require_writable(table, "--table")
    require_writable(table.with_suffix(".jsonl"), "--table")
    args.families = []
    for draft in args.draft:  # every draft is checked (config, weights) before the first one is measured
        try:
            args.families.append(family_of(load_draft(draft)))
        except DFlash2Error as err:
            raise DFlash2Error(f"--draft: {err}") from None
    args.data = args.data or sorted(str(p) for p in Path("data/regen").glob("smollm2-*") if (p / "manifest.json").is_file())
    require(bool(args.data), "no --data directory given and none found under data/regen/")
    for directory in args.data:
        try:
            load_manifest(directory)
        except DFlash2Error as err:
            raise DFlash2Error(f"--data: {err}") from None
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        settings = YardstickSettings(tuple(args.data), args.heldout, args.per_benchmark, args.max_new_tokens,
                                     args.batch_size, t1_seeds=args.t1_seeds)
        use_threads(args.threads)
        for i, draft in enumerate(args.draft):
            pipe = load_decoder(args.target, draft, args.device, args.dtype, speculate="always",
                                proposer=model_proposer(args.families[i]), lattice=False)
            print(f"# yardstick: {draft} | {pipe.header()}", file=sys.stderr)
            warn_if_busy(args.device)
            result = measure(pipe, settings, frozen_prompts(Path(args.prompts), pipe.tokenizer, settings))
            arm = args.arm[i] if args.arm else draft
            row = {"arm": arm, "draft": draft, "budget": training_budget(Path(draft)), **asdict(result),
                   **pipe.precision.record(),
                   "settings": asdict(settings), "commit": git_commit(), "machine": cpu_model(),
                   "threads": torch.get_num_threads(),
                   "machine_identity": machine_identity()}
            append_row(Path(args.table), row)
            print(f"{arm}: tau T=0 {result.tau['t0']:.3f}, T=1 {result.tau['t1']:.3f} ({args.t1_seeds} seed(s)), draft "
                  f"{result.draft_ms_per_cycle:.1f} ms/cycle ({result.prompts} prompts, {result.seconds:.0f} s)")
    except DFlash2Error as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
