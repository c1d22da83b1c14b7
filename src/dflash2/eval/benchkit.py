"""Shared pieces of `dflash2 bench` and `dflash2 analyze`: pipelines, prompts, run metadata, output.

Contract:
- `ModelSettings` (typed: target, draft, device, dtype, seed, threads, speculate, tiny) is what
  `add_model_arguments` parses (`ModelSettings.from_args`); `build_pipeline(model)` returns a
  `Pipeline`: the real target and draft it names, or, with the hidden `--tiny` option, a random
  tiny Llama target and DFlash2 draft from `dflash2.targets.tiny` with a character-level
  `TinyTokenizer` (seconds on a CPU; used by the smoke tests).
- `load_conversations(datasets, num_prompts, dataset_files)` -> {dataset name: [Conversation]} from
  the shipped benchmarks and/or user JSONL files (each its own dataset, reported under the file's
  stem; two datasets of one name are refused).
- `machine_info()` describes the machine and library versions; `git_commit()` names the commit
  of the working tree (with "+dirty" when it has uncommitted changes), or None outside git.
- `check_output(path)` refuses an --output that is a file (before anything loads).
- `write_json(path, obj)` writes atomically; `markdown_table(headers, rows)` renders a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash2.errors import require
from dflash2.fileio import atomic_write, require_writable
from dflash2.pipeline import Pipeline, cpu_has_native_bf16, load_decoder
from dflash2.data.prompts import BENCHMARKS, Conversation, load_benchmark, load_prompt_file
from dflash2.machine import check_threads


class TinyTokenizer:
    """Character-level stand-in for a real tokenizer, for the random tiny models (no chat template).

    Ids 0-2 are pad / BOS / EOS; characters map into 3..vocab_size-2 (the last id is the draft's
    MASK). Prompts are cut to `max_chars` characters so tiny runs stay fast.
    """

    chat_template = None
    eos_token_id = 2
    pad_token_id = 0

    def __init__(self, vocab_size: int, max_chars: int = 40):
        self.span = vocab_size - 4
        self.max_chars = max_chars

    def __call__(self, text: str) -> dict:
        return {"input_ids": [1] + [3 + ord(c) % self.span for c in text[-self.max_chars:]]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + (int(i) - 3) % 26) for i in ids if not (skip_special_tokens and int(i) < 3))


def tiny_pipeline(seed: int = 0, speculate: str = "auto") -> Pipeline:
    from dflash2.decoding.engine import SpeculativeDecoder
    from dflash2.decoding.verifier import TargetAdapter
    from dflash2.targets.tiny import tiny_draft, tiny_target

    target = tiny_target("llama", seed=seed)
    draft = tiny_draft(target, seed=seed)
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, speculate=speculate)
    return Pipeline(decoder, TinyTokenizer(target.config.vocab_size), (), "tiny random DFlash2 draft [DFlash2]", False)


@dataclass(frozen=True)
class ModelSettings:
    """Which target and draft a command loads, where, and how the draft is used."""
    target: str = "smollm2"
    draft: str | None = None      # checkpoint directory; None = the shipped one, else an untrained draft
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    threads: int | None = None    # torch CPU threads; None = torch's choice
    speculate: str = "auto"       # auto | always | never
    tiny: bool = False            # random tiny models (tests)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ModelSettings":
        """The options of `add_model_arguments`, checked."""
        settings = cls(args.target, args.draft, args.device, args.dtype, args.seed, args.threads, args.speculate,
                       args.tiny)
        warning = check_threads(settings.threads)
        if warning:
            print(warning, file=sys.stderr)
        return settings

    @property
    def target_label(self) -> str:
        return "tiny random llama" if self.tiny else self.target


def build_pipeline(model: ModelSettings) -> Pipeline:
    if model.threads is not None:
        torch.set_num_threads(model.threads)
    if model.tiny:
        torch.manual_seed(model.seed)
        return tiny_pipeline(model.seed, model.speculate)
    return load_decoder(model.target, model.draft, model.device, model.dtype, speculate=model.speculate)


def add_model_arguments(parser) -> None:
    """Options shared by bench and analyze: which target, draft, device and dtype."""
    parser.add_argument("--target", default="smollm2", help="built-in name (smollm2, gemma3), local HF dir or hub id")
    parser.add_argument("--draft", default=None, help="draft checkpoint directory (default: the shipped one, "
                                                      "else an untrained draft)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="float32 (needed for exact lossless checks) or bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice); "
                        "on a shared machine 1 thread can be far steadier")
    parser.add_argument("--speculate", default="auto", choices=("auto", "always", "never"),
                        help="auto (default): adaptive draft length and fallback to plain decoding when drafting "
                             "does not pay; always: the whole block every cycle")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)


def check_output(path: str, flag: str = "--output") -> None:
    """An output directory of bench / analyze: new or a directory (they write only their own files there)."""
    require(not Path(path).exists() or Path(path).is_dir(), f"{flag} '{path}' exists and is not a directory")
    require_writable(path, flag)


def parse_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    require(bool(items), f"{what}: give at least one value")
    return items


def load_conversations(datasets: list[str], num_prompts: int | None,
                       dataset_files: list[str] | None = None) -> dict[str, list[Conversation]]:
    out: dict[str, list[Conversation]] = {}
    for name in datasets:
        convs = load_benchmark(name, num_prompts)
        require(bool(convs), f"benchmark '{name}' gave no prompts")
        out[convs[0].dataset] = convs
    for path in dataset_files or []:
        convs = load_prompt_file(path)[:num_prompts]
        name = convs[0].dataset
        require(name not in out, f"--dataset-file '{path}': its dataset name '{name}' (the file's stem) is already "
                                 f"taken by {'a benchmark' if name in BENCHMARKS else 'another --dataset-file'}; "
                                 "rename the file")
        out[name] = convs
    require(bool(out), "no datasets selected: give --datasets and/or --dataset-file")
    return out


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_identity() -> dict:
    """What timings depend on, for deciding whether saved bench parts came from the same kind of machine."""
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_bf16": cpu_has_native_bf16(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def cpu_ticks() -> tuple[int, int] | None:
    """(stolen, all) CPU ticks since boot from Linux /proc/stat (steal: time the hypervisor gave to
    other guests while this one wanted to run); None where there is no such file."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the CPU's ticks between two `cpu_ticks()` readings that was stolen."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def machine_info() -> dict:
    """`machine_identity()` plus platform, library versions and the load average."""
    import transformers

    info = dict(machine_identity(), platform=platform.platform(), torch=torch.__version__,
                transformers=transformers.__version__, python=platform.python_version(),
                load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    return info


def machine_line(info: dict) -> str:
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"
    return (f"{info['cpu']}, {info['cpu_count']} CPU cores ({info['torch_threads']} torch threads){gpu}; "
            f"torch {info['torch']}, transformers {info['transformers']}")


def git_commit(path: str | Path | None = None) -> str | None:
    where = str(path or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def write_json(path: str | Path, obj) -> None:
    with atomic_write(path, "w") as handle:
        json.dump(obj, handle, indent=2, default=str)
        handle.write("\n")


def write_text(path: str | Path, text: str) -> None:
    with atomic_write(path, "w") as handle:
        handle.write(text)


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def first_turns(conversations: list[Conversation], tokenizer) -> list[list[int]]:
    from dflash2.targets.chat import encode_messages

    return [encode_messages(tokenizer, [{"role": "user", "content": c.turns[0]}]) for c in conversations]
