"""`dflash2 export DRAFT --to dflash2|dflash-v1|gguf --out DIR`: the command line of the export.

Contract: `main(argv)` parses, runs `export_draft` and prints what was written (files, parts
completed or dropped, the acceptance cost of `dflash-v1` or of dropping a draft vocabulary, the command that serves the result).
For `--to gguf` it then says whether the draft pays in llama.cpp on this machine and with which
settings (`llama_cpp_advice`, `speculation_advice`) where llama.cpp is found (`--llama-cpp DIR`,
`$DFLASH2_LLAMA_CPP`, PATH, the scripts' install), else how to install it; `--no-advice` skips it.
Bad arguments, like every `DFlash2Error`, become one line `error: ...` with exit status 2 (the
parser raises instead of printing its usage), checked before anything slow loads.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dflash2.argparsing import OneLineParser, run_command
from dflash2.errors import DFlash2Error
from dflash2.export.exporter import export_draft
from dflash2.export import llama_cpp
from dflash2.export.settings import DTYPES, FORMS, GGUF_FILE, ExportResult, ExportSettings

SERVE_HINTS = {
    "dflash2": "serve it: vLLM (GPU, V2 runner) --speculative-config "
               "'{{\"method\": \"dflash\", \"model\": \"{out}\", \"num_speculative_tokens\": 7}}'; "
               "SGLang --speculative-algorithm DFLASH --speculative-draft-model-path {out} "
               "--speculative-num-draft-tokens 8; MLX dflash: see docs/engines.md",
    "dflash-v1": "serve it: vllm serve TARGET --speculative-config "
                 "'{{\"method\": \"dflash\", \"model\": \"{out}\", \"num_speculative_tokens\": 7}}' (CPU build too)",
    "gguf": "serve it: llama-server -m TARGET.gguf -md {out}/draft.gguf --spec-type draft-dflash --spec-draft-n-max 7",
}


def parse_settings(argv: list[str]) -> tuple[argparse.Namespace, ExportSettings]:
    p = OneLineParser(prog="dflash2 export", description="Export a draft for vLLM, SGLang, MLX dflash or llama.cpp.")
    p.add_argument("draft", help="draft checkpoint directory (config.json + model.safetensors)")
    p.add_argument("--to", required=True, choices=FORMS, help="dflash2 (published layout), dflash-v1 (no convs, no "
                   "selector: vLLM CPU), gguf (llama.cpp)")
    p.add_argument("--out", required=True, help="directory to create (refused if it exists and is not empty)")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out, replacing only the export's "
                   "own files (config.json, model.safetensors, draft.gguf)")
    p.add_argument("--target", default="smollm2", help="the draft's target: built-in name, local HF dir (dflash-v1 "
                   "measurement) or the target's .gguf (gguf tokenizer); default smollm2")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weights of the export (GGUF: its matrices); "
                   "auto: the dtype the checkpoint stores")
    p.add_argument("--measure-prompts", type=int, default=4, help="dflash-v1 or a reduced draft vocabulary: prompts for the acceptance cost of the change (0: skip)")
    p.add_argument("--measure-tokens", type=int, default=64, help="new tokens per prompt of that measurement")
    p.add_argument("--llama-cpp", default=None, help="gguf: directory of llama.cpp's programs, for the advice on "
                   "whether the draft pays there (default: $DFLASH2_LLAMA_CPP, PATH, or the scripts' install)")
    p.add_argument("--no-advice", action="store_true", help="gguf: skip measuring whether the draft pays in llama.cpp")
    p.add_argument("--advice-threads", type=int, default=1, help="gguf: llama.cpp threads for the advice (the "
                   "threads you deploy with; more than the idle cores stalls llama.cpp)")
    args = p.parse_args(argv)
    if args.advice_threads < 1:
        raise DFlash2Error(f"--advice-threads must be a positive integer, got {args.advice_threads}")
    if args.to == "gguf" and not args.no_advice and args.llama_cpp:
        llama_cpp.find_llama_cpp(args.llama_cpp)   # a wrong directory fails now, before the export
    return args, ExportSettings(draft=Path(args.draft), form=args.to, out=Path(args.out), force=args.force,
                          target=args.target, dtype=args.dtype, measure_prompts=args.measure_prompts,
                          measure_tokens=args.measure_tokens)


def report(result: ExportResult) -> str:
    lines = [f"wrote {result.architecture} ({result.form}, {result.tensors} tensors, {result.dtype}) to {result.out}: "
             + ", ".join(f.name for f in result.files)]
    lines += [f"added in neutral form: {part}" for part in result.completed]
    if result.dropped:
        lines.append(f"removed: {', '.join(result.dropped)}")
    if result.cost is not None:
        lines.append(f"cost of dropping them: {result.cost.line()}")
    lines += result.notes
    lines.append(SERVE_HINTS[result.form].format(out=result.out))
    return "\n".join(lines)


def advice(args: argparse.Namespace, result: ExportResult) -> list[str]:
    lc = llama_cpp.find_llama_cpp(args.llama_cpp)
    if lc is None:
        return [f"whether this draft pays in llama.cpp here is not measured: {llama_cpp.INSTALL_HINT}"]
    if args.target.endswith(".gguf"):
        from dflash2.targets.builtin import check_gguf_model
        try:
            check_gguf_model(Path(args.target))
        except DFlash2Error as why:         # e.g. a tokenizer-only GGUF: enough for the export, not for timing
            return [f"whether this draft pays in llama.cpp here is not measured: {why}"]
    from dflash2.export.llama_cpp_advice import advice_for_export
    return advice_for_export(lc, args.target, Path(args.draft), result.out / GGUF_FILE,
                             max(args.measure_prompts, 1), args.measure_tokens, args.advice_threads)


def main(argv: list[str] | None = None) -> int:
    args, settings = parse_settings(list(sys.argv[1:] if argv is None else argv))
    result = export_draft(settings)
    print(report(result), flush=True)
    if settings.form == "gguf" and not args.no_advice:
        print("\n".join(advice(args, result)))
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
