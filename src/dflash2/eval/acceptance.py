"""`dflash2 acceptance`: one draft's acceptance on the same prompts, in dflash2 at each precision and
in every engine installed (llama.cpp at its GGUF types, vLLM's CPU build, MLX `dflash`).

    dflash2 acceptance [--draft DIR] [--target smollm2] [--prompts 6] [--max-new-tokens 64]
        [--dtypes float32,bfloat16,float16] [--engines dflash2,llama.cpp,vllm,mlx]
        [--llama-types f32,bf16,q4_1] [--llama-cpp DIR] [--target-gguf FILE] [--threads 1]
        [--out results.json [--force]]

Contract: `main(argv)` checks every option before anything loads (one line `error: ...`, exit 2),
takes `--prompts` prompts round-robin from the five shipped benchmark sets (chat-encoded), decodes
them greedily, batch 1, the draft's whole block verified every cycle, in each arm of
`eval.acceptance_arms`, and prints one table: per arm tau (tokens committed per verification
cycle, the prefill's token excluded), the per-position acceptance (the share of cycles whose drafts
1..i were all accepted, i = 1..block-1), the cycles, and how many prompts have exactly the
per-cycle counts and the output of the arm it is compared with (`reference_of`: an engine at
float32 / f32 against dflash2 float32 with the same form of the draft, bfloat16 / bf16 against
dflash2 bfloat16; q4_1 against dflash2 float32, which runs the dequantised weights). Engines not
installed are listed as skipped with how to install them. `--out` writes the whole result as JSON
(atomically; an existing file only with `--force`).
`profile(committed_lists, positions)` is the pure summary of one arm; `same_text` compares an
engine's printed output with token ids.
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from dflash2.argparsing import OneLineParser, first_paragraph, parse_list, run_command
from dflash2.errors import require
from dflash2.files.atomic import markdown_table, require_writable, write_json

ENGINES = ("dflash2", "llama.cpp", "vllm", "mlx")
DTYPES = ("float32", "bfloat16", "float16")
RUNNER_DTYPES = ("float32", "bfloat16")   # vLLM CPU and MLX: the precisions they are asked for


def profile(committed_lists: list[list[int]], positions: int) -> dict:
    """tau and per-position acceptance of per-prompt lists of tokens committed per cycle."""
    cycles = [c for run in committed_lists for c in run]
    if not cycles:
        return {"tau": None, "per_position": [None] * positions, "cycles": 0}
    per_position = [sum(1 for c in cycles if c - 1 >= i) / len(cycles) for i in range(1, positions + 1)]
    return {"tau": sum(cycles) / len(cycles), "per_position": per_position, "cycles": len(cycles)}


def reference_of(arm) -> tuple[str, str, str] | None:
    """(engine, precision, form) of the dflash2 arm an engine's arm is compared with."""
    if arm.engine == "dflash2":
        return None if arm.form == "checkpoint" else ("dflash2", "float32", "checkpoint")
    precision = {"bf16": "bfloat16", "bfloat16": "bfloat16"}.get(arm.precision, "float32")
    return "dflash2", precision, "dflash-v1" if arm.form == "dflash-v1" else "checkpoint"


def same_text(text: str, tokens: list[int], tokenizer) -> bool:
    """An engine's printed output (llama.cpp prints text, without the stop token, and is run a block
    longer than dflash2) starts with the text of `tokens`, and ends with it where `tokens` end at a
    stop token (then the engine stopped too)."""
    ref = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    stopped = bool(tokens) and tokens[-1] in tokenizer.all_special_ids
    return text.strip() == ref if stopped else text.strip().startswith(ref)


def _same_output(run: dict, ref: dict, tokenizer) -> bool:
    if run["tokens"] is not None:
        return run["tokens"] == ref["tokens"]
    return same_text(run["text"], ref["tokens"], tokenizer)


def compare(arm, arms: list, tokenizer) -> dict:
    key = reference_of(arm)
    ref = next((a for a in arms if (a.engine, a.precision, a.form) == key and a.status == "ok"), None)
    if ref is None or arm.status != "ok":
        return {"reference": None}
    pairs = list(zip(arm.runs, ref.runs))
    return {"reference": ref.key, "identical_cycles": sum(r["committed"] == f["committed"] for r, f in pairs),
            "identical_output": sum(_same_output(r, f, tokenizer) for r, f in pairs), "prompts": len(pairs)}


def parse_args(argv: list[str]):
    p = OneLineParser(prog="dflash2 acceptance", description=first_paragraph(__doc__))
    p.add_argument("--draft", default=None, help="draft checkpoint directory (default: the target's shipped draft)")
    p.add_argument("--target", default="smollm2", help="built-in name or local Hugging Face directory")
    p.add_argument("--target-gguf", default=None, help="the target's GGUF for llama.cpp (built-in targets have one)")
    p.add_argument("--prompts", type=int, default=6, help="prompts, round-robin from the five benchmark sets")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtypes", default=",".join(DTYPES), help="dflash2's precisions (and vLLM's / MLX's where they "
                   "take them: float32, bfloat16)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma list of " + ", ".join(ENGINES))
    p.add_argument("--llama-types", default="f32,bf16,q4_1", help="target GGUFs for llama.cpp: f32 / bf16 (the "
                   "target's GGUF dequantised) and q4_1 (the target's own file)")
    p.add_argument("--llama-cpp", default=None, help="directory of llama.cpp's programs (default: $DFLASH2_LLAMA_CPP, "
                   "PATH, or the scripts' .engines install)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of every engine (1: steady on a shared "
                   "machine, where llama.cpp's spinning threads stall)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    args = p.parse_args(argv)
    args.engines = parse_list(args.engines, "--engines")
    args.dtypes = parse_list(args.dtypes, "--dtypes")
    args.llama_types = [t.lower() for t in parse_list(args.llama_types, "--llama-types")]
    for name in args.engines:
        require(name in ENGINES, f"--engines: unknown engine '{name}'; choose from {', '.join(ENGINES)}")
    for name in args.dtypes:
        require(name in DTYPES, f"--dtypes: unknown precision '{name}'; choose from {', '.join(DTYPES)}")
    from dflash2.eval.acceptance_arms import LLAMA_TYPES
    for name in args.llama_types:
        require(name in LLAMA_TYPES, f"--llama-types: unknown type '{name}'; choose from {', '.join(LLAMA_TYPES)}")
    require(args.prompts > 0, f"--prompts must be a positive integer, got {args.prompts}")
    require(args.max_new_tokens > 0, f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    require(args.threads > 0, f"--threads must be a positive integer, got {args.threads}")
    require(args.draft is None or (Path(args.draft) / "config.json").is_file(),
            f"--draft '{args.draft}' is not a checkpoint directory with config.json")
    require(args.target_gguf is None or Path(args.target_gguf).is_file(), f"--target-gguf '{args.target_gguf}' "
                                                                            "is not a file")
    if "llama.cpp" in args.engines and args.llama_cpp:
        from dflash2.export.llama_cpp import find_llama_cpp
        find_llama_cpp(args.llama_cpp)   # a wrong directory is refused now, not after dflash2's arms
    if args.out:
        out = Path(args.out)
        require_writable(out, "--out")
        require(not out.is_dir(), f"--out '{out}' is a directory; give the name of a JSON file")
        require(not out.exists() or args.force, f"--out '{out}' exists; choose a new file, or pass --force to "
                                                "replace it")
    return args


def run(args) -> dict:
    import torch

    from dflash2.eval import acceptance_arms as arms_mod
    from dflash2.export import llama_cpp
    from dflash2.export.acceptance_cost import measurement_prompts
    from dflash2.model.draft import read_config
    from dflash2.pipeline import prepare_decoder, shipped_draft_path
    from dflash2.targets.builtin import BUILTIN_TARGETS, resolve_target
    from dflash2.targets.chat import stop_token_ids

    torch.set_num_threads(args.threads)
    draft = Path(args.draft) if args.draft else shipped_draft_path(args.target)
    require(draft is not None, f"target '{args.target}' has no shipped draft: pass --draft DIR")
    lc = llama_cpp.find_llama_cpp(args.llama_cpp) if "llama.cpp" in args.engines else None
    block = read_config(draft).block_size
    target_dir = resolve_target(args.target)
    plan = prepare_decoder(target_dir, str(draft), "cpu", "float32", False, "float32", "always", "draft", "auto", False)
    tokenizer = plan.tokenizer
    prompts = measurement_prompts(tokenizer, args.prompts)
    with tempfile.TemporaryDirectory(prefix="dflash2-acceptance-") as scratch:
        gguf = Path(args.target_gguf) if args.target_gguf else (
            BUILTIN_TARGETS[args.target].locate_gguf(Path(scratch)) if args.target in BUILTIN_TARGETS else None)
        job = arms_mod.Job(draft, target_dir, gguf, prompts, [tokenizer.decode(ids) for ids in prompts],
                           args.max_new_tokens, stop_token_ids(tokenizer, plan.target.config), Path(scratch))
        arms = []
        if "dflash2" in args.engines or "vllm" in args.engines:
            for dtype in args.dtypes if "dflash2" in args.engines else ["float32"]:
                arms.append(arms_mod.dflash2_arm(job, dtype))
        if "vllm" in args.engines:
            arms.append(arms_mod.dflash2_arm(job, "float32", "dflash-v1"))
        if "llama.cpp" in args.engines:
            arms += [arms_mod.llama_cpp_arm(job, lc, kind, block, args.threads) for kind in args.llama_types]
        for short in ("vllm", "mlx"):
            if short in args.engines:
                arms += [arms_mod.runner_arm(job, short, d, args.threads) for d in args.dtypes if d in RUNNER_DTYPES]
    rows = [{**asdict(a), "key": a.key, **profile([r["committed"] for r in a.runs], block - 1),
             **compare(a, arms, tokenizer)} for a in arms]
    return {"draft": str(draft), "target": args.target, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
            "block_size": block, "threads": args.threads, "arms": rows}


def table(result: dict) -> str:
    positions = result["block_size"] - 1
    headers = ["engine", "precision", "draft form", "tau"] + [f"p{i}" for i in range(1, positions + 1)] + \
        ["cycles", "same cycles / output as"]
    lines = []
    for row in result["arms"]:
        if row["status"] != "ok":
            lines.append([row["engine"], row["precision"], row["form"], row["status"]] + [""] * positions +
                         ["", row["reason"]])
            continue
        same = f"{row['identical_cycles']}/{row['prompts']} / {row['identical_output']}/{row['prompts']}: " \
               f"{row['reference']}" if row.get("reference") else "-"
        lines.append([row["engine"], row["precision"], row["form"], f"{row['tau']:.3f}" if row["tau"] else "-"] +
                     [f"{p:.3f}" if p is not None else "-" for p in row["per_position"]] + [row["cycles"], same])
    notes = [f"- {row['key']}: {note}" for row in result["arms"] for note in row["notes"]]
    return "\n".join([markdown_table(headers, lines)] + notes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    result = run(args)
    print(f"draft {result['draft']}, target {result['target']}: {result['prompts']} prompts x "
          f"{result['max_new_tokens']} new tokens, greedy, batch 1, whole block verified every cycle")
    print(table(result))
    if args.out:
        write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
