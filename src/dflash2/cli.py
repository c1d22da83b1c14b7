"""The `dflash2` command line.

Contract: `main(argv)` dispatches subcommands and returns an exit status. Every `DFlash2Error`
(bad input, including a bad argument: `argparsing.OneLineParser`) is printed as one line,
`error: ...`, with exit status 2 and no traceback (so is an `OSError`: the file system refusing a
read or write); Ctrl-C prints `interrupted` and exits 130 (`argparsing.run_command`).
Input is checked before anything slow loads: `generate` reads --messages, loads the draft (its
weights checked), the target's config and tokenizer, encodes the prompt and applies the context
rule, and only then loads the target's weights. `--compare` (`eval.compare`) warms both decoders up,
untimed, before timing either, and at T > 0 says that the two outputs are not expected to match. `init-draft` writes into an existing non-empty --out only with --force,
and then replaces only its config.json and model.safetensors.
Each handler imports the engine, the targets and the draft code itself (torch, transformers: seconds),
so `dflash2 --help` and a bad option answer at once; subcommand modules load only when named.
Run as the program, `generate` ends its process without the interpreter's teardown once its
output is out (`main`; 1.2-1.7 s saved).

    dflash2 generate --prompt TEXT [--target smollm2] [--draft DIR | --no-draft] [--compare] [--json]
    dflash2 init-draft --target T --out DIR [--layers 5] [--block-size 8] [--no-conv] [--no-selector] [--force]
    dflash2 convert-target NAME            # convert a built-in GGUF target once, into the cache
    dflash2 regenerate ... / train ... / ablation ... / bench ... / analyze ... / export ... / acceptance ...
                                           (see each --help)
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from dflash2.argparsing import (OneLineParser, add_device_arguments, add_recalibrate_argument, apply_recalibrate,
                                exit_now, run_command)
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import refuse_existing_output
from dflash2.model.shape import DEFAULT_SHAPE, DraftShape
from dflash2.files.userjson import parse_json

# Subcommands implemented in their own modules: name -> (module, help).
_DELEGATED = {
    "regenerate": ("dflash2.training.regenerate", "regenerate training responses with the target"),
    "train": ("dflash2.training.trainer", "train a draft from a YAML config"),
    "ablation": ("dflash2.eval.ablation", "equal-budget ablation: DFlash v1, +selector, +convs, DFlash2"),
    "families": ("dflash2.eval.families", "DFlash2, DFlash v1 and an MTP head at equal budget: tau and speed, one table"),
    "bench": ("dflash2.eval.bench", "benchmark acceptance length, speed and losslessness"),
    "analyze": ("dflash2.eval.analyze", "analyse a draft: recall, oracle selector, suffix decay"),
    "yardstick": ("dflash2.eval.yardstick", "real acceptance length of drafts on a fixed held-out + benchmark set"),
    "export": ("dflash2.export.command", "export a draft for vLLM, SGLang, MLX dflash or llama.cpp (GGUF)"),
    "acceptance": ("dflash2.eval.acceptance", "a draft's acceptance in dflash2 at each precision and in installed engines"),
    "serve": ("dflash2.serve.command", "OpenAI-compatible server: continuous batching, metrics, playground"),
    "loadtest": ("dflash2.tools.loadtest", "bounded load test of a dflash2 server on loopback"),
}


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="speculative generation with a target and a draft")
    p.add_argument("--prompt", help="user prompt text")
    p.add_argument("--messages", help="JSON file with a list of {role, content} chat messages")
    p.add_argument("--target", default="smollm2", help="built-in name (smollm2, gemma3), local HF dir or hub id")
    p.add_argument("--draft", help="draft checkpoint directory (default: the shipped draft for the target)")
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding (baseline)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=None)
    add_device_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice); "
                   "on a shared machine 1 thread can be far steadier")
    p.add_argument("--draft-dtype", default="auto", help="auto (the target's dtype; bf16 on CPUs with native bf16), float32, bfloat16")
    p.add_argument("--speculate", default="auto", choices=("auto", "always", "never"),
                   help="auto (default): verify only the draft tokens that pay for themselves and fall back to plain "
                        "decoding when drafting does not pay; always: verify the whole block every cycle; never: plain")
    p.add_argument("--proposer", default=None, choices=("draft", "lookup", "hybrid", "mtp"),
                   help="where proposed tokens come from: draft (the draft model), lookup (what followed the latest "
                        "tokens earlier in the prompt and output; loads no draft), hybrid (both, per row per cycle the "
                        "one expected to commit more, or both as a tree), mtp (a multi-token-prediction head: --draft "
                        "DIR of a trained one, else the target's own); default: hybrid (lookup for a target with no "
                        "trained draft), plain decoding with --no-draft")
    p.add_argument("--compare", action="store_true", help="also run the autoregressive baseline and compare")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_recalibrate_argument(p)


def _init_draft_parser(sub) -> None:
    p = sub.add_parser("init-draft", help="write a correctly shaped, untrained draft for a target")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True, help="directory to create (an existing non-empty one needs --force)")
    p.add_argument("--layers", type=int, default=DEFAULT_SHAPE.num_layers)
    p.add_argument("--block-size", type=int, default=DEFAULT_SHAPE.block_size)
    p.add_argument("--selector-rank", type=int, default=DEFAULT_SHAPE.selector_rank)
    p.add_argument("--selector-top-k", type=int, default=DEFAULT_SHAPE.selector_top_k)
    p.add_argument("--intermediate-size", type=int, default=DEFAULT_SHAPE.intermediate_size,
                   help="MLP width (default: the target's)")
    p.add_argument("--no-conv", action="store_true", help="no convolutions (with --no-selector: DFlash v1)")
    p.add_argument("--no-selector", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family", default="dflash2", choices=("dflash2", "mtp"),
                   help="dflash2 (default): a DFlash2 / DFlash block draft; mtp: a one-layer multi-token-prediction "
                        "head (the target's own where its checkpoint ships mtp.* tensors, else an untrained one; "
                        "of the shape options only --block-size applies)")
    p.add_argument("--force", action="store_true",
                   help="write into an existing, non-empty --out: replaces its config.json and model.safetensors, "
                        "nothing else")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dflash2", description="DFlash2 speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _init_draft_parser(sub)
    p = sub.add_parser("convert-target", help="convert a built-in GGUF target into the cache (once)")
    p.add_argument("name")
    p.add_argument("--force", action="store_true")
    for name, (_module, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def cmd_generate(args) -> int:
    from dflash2.decoding.loop.engine import GenerationConfig
    from dflash2.runtime.machine import check_threads, use_threads
    from dflash2.eval.audit import audit, reference_loader
    from dflash2.eval.compare import compare
    from dflash2.pipeline import prepare_decoder
    from dflash2.targets.chat import encode_messages, encode_prompt

    require((args.prompt is None) != (args.messages is None), "give exactly one of --prompt or --messages")
    require(not (args.no_draft and args.block_size is not None and args.proposer != "lookup"),
            "--block-size sets the draft's block, so it has no effect with --no-draft; drop one of them")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, block_size=args.block_size, seed=args.seed)
    config.validate()
    apply_recalibrate(args)
    threads_warning = check_threads(args.threads)
    if args.prompt is not None:
        require(args.prompt.strip() != "", "empty prompt: --prompt has no text")
    messages = read_messages(args.messages) if args.messages is not None else None
    plan = prepare_decoder(args.target, args.draft, args.device, args.dtype, args.no_draft, args.draft_dtype,
                           args.speculate, args.proposer, exact_verify=args.exact_verify, weights=args.weights)
    chat = False if args.no_chat else None
    if messages is not None:
        ids = encode_messages(plan.tokenizer, messages, chat)
    else:
        ids = encode_prompt(plan.tokenizer, args.prompt, chat)
    plan.check_prompt(ids, config)
    block_warning = _block_size_warning(plan, config)
    if threads_warning:
        print(threads_warning, file=sys.stderr)
    use_threads(args.threads)
    pipe = plan.load()
    config.stop_token_ids = pipe.stop_token_ids
    if block_warning:
        print(block_warning, file=sys.stderr)
    if not args.json:
        print(f"# target: {args.target} | draft: {pipe.draft_description} | {pipe.header()}", file=sys.stderr)
        if not pipe.trained_draft and plan.proposer in ("draft", "hybrid"):
            print("# note: no trained draft ships for this target yet, so acceptance will be low; output is "
                  "still exactly the target's", file=sys.stderr)
    if args.compare:   # both decoders warmed up, untimed, before either timed run
        comparison = compare(pipe.decoder, ids, config, lambda _: _run_streaming(pipe, ids, config, not args.json))
        report = _report(pipe, comparison.speculative)
        report.update(baseline_tokens_per_second=comparison.baseline_tokens_per_second, speedup=comparison.speedup,
                      identical=comparison.identical, identical_expected=config.temperature == 0)
        if config.temperature == 0:   # a greedy mismatch: a numerical near-tie or a defect (eval.audit)
            found = audit([(ids, comparison.baseline.tokens, comparison.speculative.tokens)], reference_loader(pipe),
                          pipe.precision.name)
            report.update(near_ties=found.near_ties, defects=found.defects, worst_margin=found.worst_margin,
                          audit=found.to_dict())
    else:
        report = _report(pipe, _run_streaming(pipe, ids, config, echo=not args.json))
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report)
    return 0


def read_messages(path: str) -> list:
    """The --messages file: a JSON list of chat messages, checked before any model loads."""
    from dflash2.targets.chat import check_messages

    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as err:
        raise DFlash2Error(f"--messages '{path}': {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise DFlash2Error(f"--messages '{path}' is not UTF-8 text (byte {err.start})") from None
    messages = parse_json(text, f"--messages '{path}'")
    require(isinstance(messages, list), f"--messages '{path}' must hold a JSON list of messages")
    check_messages(messages, f"--messages '{path}': ")
    return messages


def _block_size_warning(plan, config) -> str | None:
    """A block above the one the draft was trained with: what it costs, in one line."""
    trained = plan.draft.config.block_size if plan.draft is not None else None
    if config.block_size is None or trained is None or config.block_size <= trained:
        return None
    return (f"# warning: --block-size {config.block_size} is above the block size {trained} this draft was trained "
            f"with: block positions {trained + 1}..{config.block_size} were never trained, so they are rarely "
            f"accepted, while every cycle drafts and verifies {config.block_size} tokens instead of {trained} "
            "(more time per cycle for little or no gain)")


def _run_streaming(pipe, ids, config, echo: bool):
    """Decode one prompt, printing text as it is committed; returns the GenerationResult."""
    tokens: list[int] = []
    printed = ""
    result = None
    for event in pipe.decoder.decode_events([ids], config):
        tokens += event.tokens
        if echo:
            text = pipe.tokenizer.decode(tokens, skip_special_tokens=True)
            print(text[len(printed):], end="", flush=True)
            printed = text
        if event.result is not None:
            result = event.result
    if echo:
        print()
    return result


def _report(pipe, result) -> dict:
    stats, timing = result.stats.as_dict(), result.timing
    return {
        "text": pipe.tokenizer.decode(result.tokens, skip_special_tokens=True),
        "new_tokens": stats["new_tokens"], "finish_reason": result.finish_reason,
        "acceptance_length": stats["acceptance_length"] if stats["cycles"] else None,  # undefined without a cycle
        "tokens_per_second": stats["new_tokens"] / timing.total_seconds if timing.total_seconds else 0.0,
        "cycles": stats["cycles"], "plain_steps": stats["plain_steps"],
        "drafts_verified_per_cycle": stats["mean_drafts_verified"], "draft_lengths": stats["draft_lengths"],
        "fallback_seconds": timing.plain_seconds, "histogram": stats["histogram"],
        "position_acceptance": stats["position_acceptance"], "phase_seconds": timing.phase_seconds,
        "speculate": pipe.decoder.speculate, "draft": pipe.draft_description, "proposer": pipe.decoder.proposer,
        "cycles_by_source": stats["cycles_by_source"], "accepted_by_source": stats["accepted_by_source"],
        "tree_cycles": stats["tree_cycles"], "tree_extra_tokens": stats["tree_extra_tokens"],
        **pipe.precision.record(), "exact_verify": pipe.decoder.target.exact_verify,
    }


def _print_report(report: dict) -> None:
    print("---")
    length = "n/a (no cycle drafted)" if report["acceptance_length"] is None else f"{report['acceptance_length']:.2f}"
    print(f"new tokens: {report['new_tokens']} ({report['finish_reason']}) | cycles: {report['cycles']} | "
          f"acceptance length: {length} | {report['tokens_per_second']:.1f} tok/s")
    if report["plain_steps"]:
        print(f"plain steps (no draft): {report['plain_steps']} ({report['fallback_seconds']:.2f} s)")
    if report["accepted_by_source"]:
        sources = " ".join(f"{k} {report['accepted_by_source'][k]} in {n} cycles"
                           for k, n in report["cycles_by_source"].items())
        print(f"accepted proposed tokens: {sources}")
    if report["tree_cycles"]:
        print(f"tree cycles (draft and lookup in one pass): {report['tree_cycles']} "
              f"({report['tree_extra_tokens']} extra tokens verified)")
    if report["cycles"]:
        lengths = " ".join(f"{k}:{v}" for k, v in report["draft_lengths"].items())
        print(f"drafts verified per cycle: {report['drafts_verified_per_cycle']:.2f} (lengths {lengths})")
        hist = " ".join(f"{k}:{v}" for k, v in report["histogram"].items())
        pos = " ".join(f"{p:.2f}" for p in report["position_acceptance"])
        print(f"tokens per cycle histogram: {hist}")
        print(f"acceptance by block position: {pos}")
    phases = " ".join(f"{k}={v:.3f}s" for k, v in report["phase_seconds"].items())
    print(f"time: {phases}")
    if "speedup" in report:
        note = "" if report["identical_expected"] else (
            " (expected at T > 0: both runs are samples of the target's distribution, so they need not match; "
            "only T=0 promises identical output)")
        print(f"baseline: {report['baseline_tokens_per_second']:.1f} tok/s | speedup: {report['speedup']:.2f}x | "
              f"identical to baseline: {report['identical']}{note}")
        if report.get("audit") and report["audit"]["mismatches"]:
            print(_divergence_line(report["audit"]))


def _divergence_line(found: dict) -> str:
    """Where and why the greedy output left plain decoding's (`eval.audit`), in one line."""
    first = found["divergences"][0]
    if first["margin"] is None:
        return (f"DEFECT: the output ends at token {first['position']} where plain {found['dtype']} decoding's does "
                "not (a decoder fault, not rounding)")
    what = ("a numerical near-tie: the two tokens were within what " + found["dtype"] + " rounding moves"
            if first["kind"] == "near-tie" else "a DEFECT: no rounding explains it (a decoder fault)")
    return (f"differs from plain {found['dtype']} decoding at token {first['position']} ({first['plain_token']} vs "
            f"{first['other_token']}): float32 margin {first['margin']:.3g}, near-tie bound "
            f"{found['near_tie_bound']:g}: {what}")


def cmd_init_draft(args) -> int:
    from dflash2.model.draft import CHECKPOINT_FILES
    from dflash2.pipeline import new_draft
    from dflash2.targets.builtin import open_target

    for flag, value, least in (("--layers", args.layers, 1), ("--block-size", args.block_size, 2),
                               ("--selector-rank", args.selector_rank, 1), ("--selector-top-k", args.selector_top_k, 1),
                               ("--intermediate-size", args.intermediate_size, 1)):
        require(value is None or value >= least, f"{flag} must be an integer >= {least}, got {value}")
    refuse_existing_output(args.out, args.force, "--out", "--force", f"its {' and '.join(CHECKPOINT_FILES)}")
    shape = DraftShape(num_layers=args.layers, block_size=args.block_size, intermediate_size=args.intermediate_size,
                       use_conv=not args.no_conv, use_selector=not args.no_selector,
                       selector_rank=args.selector_rank, selector_top_k=args.selector_top_k)
    target = open_target(args.target)  # config and tokenizer: the draft needs no target weights
    if args.family == "mtp":
        return _init_mtp_head(args, target)
    draft = new_draft(target.config, target.tokenizer, shape, seed=args.seed)
    draft.save_pretrained(args.out)
    c = draft.config
    print(f"wrote untrained {c.architecture} to {args.out}: {draft.num_parameters() / 1e6:.1f} M parameters, "
          f"{c.num_hidden_layers} layers, target layers {c.target_layer_ids}, mask token {c.mask_token_id}")
    return 0


def _init_mtp_head(args, target) -> int:
    """`init-draft --family mtp`: the target's own MTP head (its `mtp.*` tensors), else an untrained one."""
    from dflash2.model.families import target_head
    from dflash2.model.mtp import create_mtp_head
    from dflash2.model.mtp_checkpoint import save_mtp_head
    from dflash2.model.shape import target_text_config
    from dflash2.targets.chat import choose_mask_token

    head = target_head(target, block_size=args.block_size)
    if head is None:
        vocab = target_text_config(target.config).vocab_size
        head = create_mtp_head(target.config, args.block_size, args.seed, choose_mask_token(target.tokenizer, vocab))
    save_mtp_head(head, args.out)
    what = "the target's own MTP head" if head.config.origin == "target" else "an untrained MTP head"
    print(f"wrote {what} to {args.out}: {head.num_parameters() / 1e6:.1f} M parameters, one "
          f"{head.config.family} layer, block {head.config.block_size}, target layer {head.config.target_layer_ids}")
    return 0


def cmd_convert_target(args) -> int:
    from dflash2.targets.builtin import convert_builtin

    start = time.perf_counter()
    path = convert_builtin(args.name, force=args.force)
    print(f"{args.name}: {path} ({time.perf_counter() - start:.1f} s)")
    return 0


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in _DELEGATED:
        module = importlib.import_module(_DELEGATED[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    handler = {"generate": cmd_generate, "init-draft": cmd_init_draft, "convert-target": cmd_convert_target}
    return handler[args.command](args)


_EXIT_AT_ONCE = {"generate"}   # commands whose process ends without the interpreter's teardown


def main(argv: list[str] | None = None) -> int:
    """`argv` None: this is the program (`dflash2 ...`, `python -m dflash2.cli`), and a command in
    `_EXIT_AT_ONCE` ends the process itself (`argparsing.exit_now`); called with a list (tests,
    scripts), it only returns the status."""
    args = list(sys.argv[1:] if argv is None else argv)
    code = run_command(_dispatch, args)
    if argv is None and args and args[0] in _EXIT_AT_ONCE:
        exit_now(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
