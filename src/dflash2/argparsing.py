"""The command lines' argument parser, with the CLI's error contract.

Contract: `OneLineParser` is `argparse.ArgumentParser` whose errors (an unknown option, a missing
one, a value of the wrong type or choice) raise `DFlash2Error` with one line naming the option,
instead of printing the usage block and exiting, so `dflash2.cli.main` prints them like every
other bad input (`error: ...`, exit status 2). It also refuses an argument that is not UTF-8 text
(bytes a shell passed through undecoded), naming the option. Sub-parsers inherit the class.

`run_command(main, argv)` is that error contract for every entry point (`dflash2 ...` and each
`python -m` module): it runs `main(argv)` and turns a `DFlash2Error` or `OSError` (the file system
refusing a read or write) into one line `error: ...` with exit status 2 and no traceback, and
Ctrl-C into `interrupted` with status 130. `exit_now(code)` ends the process once its output is
out (stdout, stderr and the logging handlers flushed), skipping the interpreter's teardown: after
a model has run, freeing every module, tensor and object one by one took 1.2-1.7 s of the
user's wait, which the operating system does at once (for commands that leave nothing to clean
up at exit: `dflash2 generate`).

`ModelSettings` (target, draft, device, dtype, seed, threads, speculate, tiny, proposer, lattice,
exact_verify, weights) is what `add_model_arguments` adds to a parser and `ModelSettings.from_args` reads
back, checked (bench, analyze, cycles, ablation; `pipeline.build_pipeline` loads it): the device
against this torch build and machine, the dtype's name (`devices.settle`), before anything loads.
`add_device_arguments(parser)` is the one `--device` / `--dtype auto` / `--exact-verify` /
`--weights` of every command that loads a target (generate, serve, regenerate and yardstick add it themselves). `add_recalibrate_argument(p)` is
the one `--recalibrate` of every command that decodes (generate, bench, analyze, cycles,
yardstick, serve); `apply_recalibrate(args)` passes it on to the cost model's calibration store. `parse_list(text, what)` splits a
comma-separated option, refusing an empty one. `first_paragraph(doc)`: a module docstring's first paragraph
on one line, a command's `--help` description. `say(message, who)`: one progress line of a command
on stderr, `who: message`, written around any progress bar on the screen.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, replace
from typing import Callable, NoReturn

from dflash2.files.cache import RECALIBRATE_ENV
from dflash2.errors import DFlash2Error, require
from dflash2.runtime.machine import announce_threads


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise DFlash2Error(message)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        self._require_text(namespace)
        return namespace, extras

    def _require_text(self, namespace: argparse.Namespace) -> None:
        for dest, value in vars(namespace).items():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, str):
                    _require_utf8(item, self._option_name(dest))

    def _option_name(self, dest: str) -> str:
        for action in self._actions:
            if action.dest == dest:
                return action.option_strings[-1] if action.option_strings else action.metavar or dest
        return dest


def run_command(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    try:
        return int(main(argv) or 0)
    except DFlash2Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the file system said no (permissions, a full disk, a path through a file)
        where = f" ('{err.filename}')" if err.filename else ""
        print(f"error: {err.strerror or err}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def exit_now(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe or stream: nothing more can reach it
            pass
    logging.shutdown()
    os._exit(code)


def _require_utf8(text: str, option: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(text[err.start]) - 0xDC00 if 0xDC80 <= ord(text[err.start]) <= 0xDCFF else None
        shown = f"byte 0x{byte:02x}" if byte is not None else f"character {text[err.start]!r}"
        raise DFlash2Error(f"{option} is not UTF-8 text ({shown} at position {err.start}); pass UTF-8 text") from None


@dataclass(frozen=True)
class ModelSettings:
    """Which target and draft a command loads, where, and how the draft is used."""
    target: str = "smollm2"
    draft: str | None = None      # checkpoint directory; None = the shipped one, else an untrained draft
    device: str = "cpu"
    dtype: str = "auto"           # auto: bfloat16 where the device computes it natively (`devices`)
    seed: int = 0
    threads: int | None = None    # torch CPU threads; None = torch's choice
    speculate: str = "auto"       # auto | always | never
    tiny: bool = False            # random tiny models (tests)
    proposer: str | None = None   # draft | lookup | hybrid | mtp; None: the pipeline's default
    lattice: bool = False         # the draft's lattice's second path as a tree branch (greedy rows)
    exact_verify: bool = False    # verify passes reproduce one-token steps (`decoding.verifier.exact`)
    weights: str = "float"        # the target's layers: float, or int8 / int4 (`pipeline.check_weights`)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ModelSettings":
        """The options of `add_model_arguments`, checked (the device against this torch and machine)."""
        from dflash2.runtime.devices import settle   # imports torch: not for `--help`

        device, _ = settle(args.device, args.dtype)
        settings = cls(args.target, args.draft, device, args.dtype, args.seed, args.threads, args.speculate,
                       args.tiny, getattr(args, "proposer", None), getattr(args, "lattice", False),
                       getattr(args, "exact_verify", False), getattr(args, "weights", "float"))
        apply_recalibrate(args)
        announce_threads(settings.threads)
        return settings

    def measuring_the_draft(self) -> "ModelSettings":
        """These settings with the `draft` proposer unless one was asked for, and its path alone:
        commands that measure the draft itself (analyze, cycle profiles, the yardstick's tau) must not
        mix in lookup's tokens or a second branch of its lattice."""
        return replace(self, proposer=self.proposer or "draft", lattice=False)

    @property
    def target_label(self) -> str:
        return "tiny random llama" if self.tiny else self.target


def add_model_arguments(parser, several_proposers: bool = False) -> None:
    """Options shared by bench and analyze: which target, draft, device and dtype. With
    `several_proposers`, `--proposer` takes a comma list (the command checks it)."""
    parser.add_argument("--target", default="smollm2", help="built-in name (smollm2, gemma3), local HF dir or hub id")
    parser.add_argument("--draft", default=None, help="draft checkpoint directory (default: the shipped one, "
                                                      "else an untrained draft)")
    add_device_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice); "
                        "on a shared machine 1 thread can be far steadier")
    parser.add_argument("--speculate", default="auto", choices=("auto", "always", "never"),
                        help="auto (default): adaptive draft length and fallback to plain decoding when drafting "
                             "does not pay; always: the whole block every cycle")
    if several_proposers:
        parser.add_argument("--proposer", default=None,
                            help="where proposed tokens come from: draft, lookup, hybrid or mtp, or a comma list of them, "
                                 "each measured side by side against one autoregressive baseline (default: hybrid, "
                                 "or lookup for a target with no trained draft)")
    else:
        parser.add_argument("--proposer", default=None, choices=("draft", "lookup", "hybrid", "mtp"),
                            help="where proposed tokens come from (default: hybrid, the draft and lookup proposals, "
                                 "or lookup for a target with no trained draft); lookup loads no draft; mtp a "
                                 "multi-token-prediction head (--draft DIR, else the target's own)")
    parser.add_argument("--lattice", action="store_true",
                        help="let greedy rows verify the second path of the draft's candidate lattice beside its "
                             "path as a token tree, where the cost model says it pays (off by default: it did "
                             "not pay on a 2-core CPU, BENCHMARKS.md section 1.3)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    add_recalibrate_argument(parser)


def add_device_arguments(parser, exact_verify: bool = True, weights: bool = True) -> None:
    """`--device` and `--dtype` (and `--exact-verify`, `--weights`) of every command that loads the target."""
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or xpu (checked against this torch "
                                                        "and machine before anything loads)")
    parser.add_argument("--dtype", default="auto", help="auto (default): bfloat16 where the device computes it "
                        "natively (CUDA from Ampere on, CPUs with avx512_bf16 or AMX), float32 elsewhere; or float32, "
                        "bfloat16, float16")
    if exact_verify:
        parser.add_argument("--exact-verify", action="store_true",
                            help="verify passes compute each position exactly as a one-token step does (windowed "
                                 "float32 attention in both), so greedy output equals plain decoding's at any precision where "
                                 "the device's matrix products are batch-invariant (bfloat16 on avx512_bf16 / AMX "
                                 "CPUs; float32 for dflash2's Llama where oneDNN's packed kernel is, e.g. AVX2-only "
                                 "AMD EPYC); refused where they are not")
    if weights:
        parser.add_argument("--weights", default="float", choices=("float", "int8", "int4"),
                            help="the target's layer weights: float (default: as loaded, at --dtype), or int8 / int4 "
                                 "weight-only quantized (CPU, bfloat16, dflash2's own Llama such as SmolLM2; int4 in "
                                 "groups of 32, the grid of SmolLM2's Q4_1 GGUF); output is then exact against that "
                                 "quantized target, not the float one")


def add_recalibrate_argument(parser) -> None:
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure the decoding cost model again instead of using the one stored for this machine, "
                             "target and dtype (it is also measured again when older than a week, and replaced when "
                             "decoding observes other costs)")


def apply_recalibrate(args: argparse.Namespace) -> None:
    if getattr(args, "recalibrate", False):
        os.environ[RECALIBRATE_ENV] = "1"


def say(message: str, who: str = "dflash2") -> None:
    from tqdm import tqdm

    tqdm.write(f"{who}: {message}", file=sys.stderr)


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of `doc` as one line (a docstring's first line may stop mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def parse_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    require(bool(items), f"{what}: give at least one value")
    return items
