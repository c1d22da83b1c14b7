"""`dflash2 families CONFIG.yaml`: DFlash2, DFlash v1 and an MTP head at equal budget, one table.

Contract:
- Arms (`FAMILY_ARMS`): `dflash2` (selector and convolutions), `dflash-v1` (neither), `mtp` (a
  one-layer MTP head, `draft.family=mtp`). Every arm trains from the same config and overrides
  (same data, seed, schedule, verify width `draft.block_size`, and budget: `train.steps`, or
  `train.max_cpu_seconds` for equal CPU-hours) into OUTPUT/<arm> (`eval.ablation.train_arm`).
- Each arm is then measured the same way:
  - the yardstick (`eval.yardstick.measure`: real speculative decoding, the whole block verified
    every cycle, T=0 and T=1 with top-p 0.95 / top-k 20; tau, per-position acceptance, draft
    milliseconds per cycle) on ONE frozen prompt set, OUTPUT/yardstick-prompts.json (the held-out
    records of the config's `data.train` plus benchmark prompts) -> OUTPUT/<arm>/yardstick.json;
  - end-to-end speed (`eval.bench.run_bench`: the arm's decoder, `--speculate auto`, beside its own
    autoregressive baseline, the default precisions (`--dtype auto`, `--draft-dtype auto`)) at each
    `--concurrency` (default 1 and 8), T=0 and T=1 -> OUTPUT/<arm>/speed-t0, speed-t1.
  `--train-only` stops after training (measure every arm later, on one quiet machine). What exists
  is reused (delete it to redo): an interrupted run resumes where it stopped. What was
  made under other options is refused in one line before anything runs: an arm trained with
  another config (`eval.ablation.train_arm`), frozen yardstick prompts of other data or counts,
  a speed run of other datasets, prompts, tokens or batch sizes (`check_measured`).
- Writes OUTPUT/families.json and OUTPUT/families.md: per arm its parameters, the budget it used
  (steps, tokens, CPU hours), tau at T=0 / T=1, per-position acceptance, draft ms per cycle,
  tokens/s and speedup per batch size and temperature; which arm wins each measure and the
  draft-cost / tau trade-off behind it; the published and community figures beside
  (`REFERENCES`).
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from dflash2.argparsing import ModelSettings, parse_list
from dflash2.data.prompts import load_conversations
from dflash2.decoding.proposers.kinds import model_proposer
from dflash2.errors import require
from dflash2.eval import bench
from dflash2.eval.yardstick import YardstickSettings, frozen_prompts, measure
from dflash2.files.atomic import check_output, fmt, markdown_table, write_json, write_text
from dflash2.model.families import load_draft
from dflash2.pipeline import build_pipeline, load_decoder
from dflash2.runtime.provenance import git_commit, machine_info, machine_line
from dflash2.eval.ablation import arms_parser, check_trained_arm, chosen_arms, train_arm, trained_only
from dflash2.training.config import load_config
from dflash2.training.preflight import check_inputs

FAMILY_ARMS = {  # arm -> its own config overrides
    "dflash2": ["draft.family=dflash2", "draft.use_selector=true", "draft.use_conv=true"],
    "dflash-v1": ["draft.family=dflash2", "draft.use_selector=false", "draft.use_conv=false"],
    "mtp": ["draft.family=mtp"],
}
TEMPERATURES = {"t0": {"temperature": 0.0}, "t1": {"temperature": 1.0, "top_p": 0.95, "top_k": 20}}
LABELS = {"t0": "T=0", "t1": "T=1"}
REFERENCES = [  # (source, what, figures)
    ("DFlash2 release (docs/spec.md section 5)", "Qwen3.8-27B, H200, T=1, mean tau of five sets",
     "DFlash2 4.80, native MTP 4.28, DSpark 3.62"),
    ("DFlash2 release (docs/spec.md section 5)", "Qwen3.5-4B, mean tau", "DFlash2 5.97, DFlash 4.92, MTP 4.54"),
    ("llama.cpp PR 22105 (issue 47)", "a 27B hybrid Qwen", "MTP tau 2.74 at 46 tok/s, DFlash tau 3.22 at 38 tok/s"),
    ("ik_llama.cpp PR 1970 (issue 47)", "tokens/s", "MTP 70.1, DFlash 61.4"),
    ("MTPLX PR 335 (issue 47)", "tokens/s", "DFlash2 5-8 % ahead of MTP"),
]


def arm_family(arm: str) -> str:
    return "mtp" if arm == "mtp" else "dflash2"


def arm_proposer(arm: str) -> str:
    return model_proposer(arm_family(arm))


def yardstick_arm(arm_dir: Path, arm: str, settings: YardstickSettings, prompts_file: Path, target: str) -> dict:
    out = arm_dir / "yardstick.json"
    if out.is_file():
        return json.loads(out.read_text())
    pipe = load_decoder(target, str(arm_dir / "final"), speculate="always", proposer=arm_proposer(arm))
    result = asdict(measure(pipe, settings, frozen_prompts(prompts_file, pipe.tokenizer, settings)))
    write_json(out, result)
    return result


def speed_arm(arm_dir: Path, arm: str, temperature: str, args) -> dict:
    out = arm_dir / f"speed-{temperature}"
    if (out / "results.json").is_file():
        return json.loads((out / "results.json").read_text())
    model = ModelSettings(target=args.target, draft=str(arm_dir / "final"), proposer=arm_proposer(arm),
                          threads=args.threads)
    settings = bench.BenchSettings(model, tuple(parse_list(args.datasets, "--datasets")),
                                   num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
                                   concurrency=tuple(args.concurrency), output=str(out),
                                   **TEMPERATURES[temperature]).validate()
    return bench.run_bench(build_pipeline(model), settings)


def arm_entry(arm: str, arm_dir: Path, trained: dict, yard: dict, speed: dict, concurrency: list[int]) -> dict:
    summary = trained["summary"]
    entry = {"family": arm_family(arm), "parameters": load_draft(arm_dir / "final").num_parameters(),
             "steps": summary["steps"], "tokens": summary["tokens"], "cpu_hours": summary["cpu_seconds"] / 3600,
             "teacher_forced_tau": summary.get("last", {}).get("tau"), "tau": yard["tau"],
             "position_acceptance": yard["extra"]["position_acceptance"],
             "draft_ms_per_cycle": yard["draft_ms_per_cycle"], "speed": {},
             "dtype": next(iter(speed.values()))["settings"].get("dtype"),
             "commit": next(iter(speed.values())).get("commit")}   # the code its speed rows ran
    for temp, results in speed.items():
        for c in concurrency:
            cell = results["overall"]["by_concurrency"][str(c)]
            entry["speed"][f"{temp}-b{c}"] = {"tokens_per_second": cell["tokens_per_second"],
                                              "speedup": cell["speedup"], "tau": cell["acceptance_length"],
                                              "baseline_tokens_per_second": cell["baseline_tokens_per_second"]}
    return entry


def verdicts(arms: dict) -> list[str]:
    """Which arm wins each measure, and the trade-off behind it (tau against draft cost)."""
    lines = []
    for temp in TEMPERATURES:
        best = max(arms, key=lambda a: arms[a]["tau"][temp])
        lines.append(f"- tau {LABELS[temp]}: {best} ({fmt(arms[best]['tau'][temp])})")
    for cell in next(iter(arms.values()))["speed"]:
        best = max(arms, key=lambda a: arms[a]["speed"][cell]["speedup"] or 0.0)
        others = ", ".join(f"{a} {fmt(arms[a]['speed'][cell]['speedup'])}x" for a in arms if a != best)
        lines.append(f"- speed {cell}: {best} {fmt(arms[best]['speed'][cell]['speedup'])}x ({others})")
    cheapest = min(arms, key=lambda a: arms[a]["draft_ms_per_cycle"])
    lines.append(f"- draft pass: {cheapest} is the cheapest per cycle; per arm, ms per cycle and tau T=0 per ms: "
                 + ", ".join(f"{a} {fmt(e['draft_ms_per_cycle'], 1)} ms, {fmt((e['tau']['t0'] - 1) / max(e['draft_ms_per_cycle'], 1e-9), 3)}"
                             for a, e in arms.items()))
    return lines


def render(result: dict, concurrency: list[int]) -> str:
    arms = result["arms"]
    cells = [f"{t}-b{c}" for t in TEMPERATURES for c in concurrency]
    headers = ["arm", "params (M)", "steps", "tokens (M)", "CPU h", "tau T=0", "tau T=1", "draft ms/cycle"] + \
              [f"{c} tok/s (speedup)" for c in cells]
    rows = [[a, e["parameters"] / 1e6, e["steps"], e["tokens"] / 1e6, e["cpu_hours"], e["tau"]["t0"], e["tau"]["t1"],
             e["draft_ms_per_cycle"]] + [f"{fmt(e['speed'][c]['tokens_per_second'], 1)} ({fmt(e['speed'][c]['speedup'])}x)"
                                         for c in cells] for a, e in arms.items()]
    width = max(len(e["position_acceptance"]["t0"]) for e in arms.values())
    positions = [[a] + [fmt(p) for p in e["position_acceptance"]["t0"]] for a, e in arms.items()]
    measured = {a: (e.get("commit") or "?")[:7] for a, e in arms.items()}
    measured = measured if len(set(measured.values())) > 1 else {}
    return "\n".join([
        "# Draft families at equal budget and verify width\n",
        f"- command: `{result['command']}`", f"- commit {result['commit']}; {result['machine']}",
        *(["- arms measured at other commits (resumed runs): " + ", ".join(f"{a} {c}" for a, c in measured.items())]
          if measured else []),
        "- tau: the yardstick (real speculative decoding, whole block verified every cycle, the same frozen prompts "
        "for every arm); speed: `dflash2 bench` with `--speculate auto`, each arm beside its own autoregressive "
        "baseline (speedup is that ratio; tokens/s on a shared machine are noisy); target precision: "
        + ", ".join(sorted({str(e.get("dtype")) for e in arms.values()})) + "\n",
        markdown_table(headers, rows),
        "\n## Per-position acceptance at T=0 (share of cycles whose drafts 1..k were all accepted)\n",
        markdown_table(["arm"] + [f"k={k + 1}" for k in range(width)], positions),
        "\n## Where each family wins\n", *result["verdicts"],
        "\n## Published and community figures (other targets and hardware)\n",
        markdown_table(["source", "setting", "figures"], [list(r) for r in REFERENCES])]) + "\n"


def parse_args(argv):
    p = arms_parser("dflash2 families", "DFlash2, DFlash v1 and an MTP head trained at equal budget and verify "
                    "width, measured by the yardstick and end-to-end speed: one table.", FAMILY_ARMS, "runs/families")
    p.add_argument("--num-prompts", type=int, default=10, help="speed: prompts per dataset")
    p.add_argument("--max-new-tokens", type=int, default=128, help="speed: new tokens per prompt")
    p.add_argument("--concurrency", default="1,8", help="speed: batch sizes")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads for the speed runs")
    p.add_argument("--heldout", type=int, default=12, help="yardstick: held-out prompts per data directory")
    p.add_argument("--per-benchmark", type=int, default=2, help="yardstick: prompts per benchmark")
    p.add_argument("--yardstick-tokens", type=int, default=96, help="yardstick: new tokens per prompt")
    args = p.parse_intermixed_args(argv)
    args.arms = chosen_arms(args.arms, FAMILY_ARMS)
    items = parse_list(args.concurrency, "--concurrency")
    require(all(c.isdigit() and int(c) > 0 for c in items), f"--concurrency must be positive integers, got '{args.concurrency}'")
    args.concurrency = [int(c) for c in items]
    for flag in ("num_prompts", "max_new_tokens", "heldout", "per_benchmark", "yardstick_tokens"):
        require(getattr(args, flag) > 0, f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(args, flag)}")
    return args


def check_reusable(path: Path, stored: dict, asked: dict) -> None:
    """One line unless what `path` holds was made with the settings `asked` (each key's value)."""
    for key, value in asked.items():
        require(stored.get(key) == value, f"{path} was made with {key} = {stored.get(key)!r}, and this run asks for "
                f"{value!r}: give the same options to reuse it, or delete it to measure again")


def check_measured(out: Path, args, configs: dict, data: tuple[str, ...]) -> None:
    """What an earlier run made is reused only under the same options: each trained arm, the frozen
    yardstick prompts and each speed run."""
    for arm, cfg in configs.items():
        if (out / arm / "final").is_dir() and (out / arm / "train_config.yaml").is_file():
            check_trained_arm(out / arm, cfg)
    prompts = out / "yardstick-prompts.json"
    if prompts.is_file():
        check_reusable(prompts, json.loads(prompts.read_text()).get("settings", {}),
                       {"data_dirs": [str(d) for d in data], "heldout": args.heldout, "per_benchmark": args.per_benchmark})
    for arm in args.arms:
        for temp in TEMPERATURES:
            results = out / arm / f"speed-{temp}" / "results.json"
            if results.is_file():
                check_reusable(results, json.loads(results.read_text())["settings"],
                               {"datasets": parse_list(args.datasets, "--datasets"), "num_prompts": args.num_prompts,
                                "max_new_tokens": args.max_new_tokens, "concurrency": args.concurrency})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    configs = {arm: load_config(args.config, [*args.overrides, *FAMILY_ARMS[arm]]) for arm in args.arms}
    for cfg in configs.values():   # bad config values and data fail here, before any training
        check_inputs(cfg)
    load_conversations(parse_list(args.datasets, "--datasets"), args.num_prompts)
    check_output(args.output)
    out = Path(args.output)
    data = tuple(next(iter(configs.values())).data.train)
    check_measured(out, args, configs, data)
    out.mkdir(parents=True, exist_ok=True)
    commit = git_commit()   # the commit whose code runs, read before the (long) run
    trained = {arm: train_arm(args.config, args.overrides, arm, out, FAMILY_ARMS[arm]) for arm in args.arms}
    if args.train_only:
        return trained_only(args.arms)
    yard_settings = YardstickSettings(data, args.heldout, args.per_benchmark, args.yardstick_tokens)
    arms = {}
    for arm in args.arms:
        yard = yardstick_arm(out / arm, arm, yard_settings, out / "yardstick-prompts.json", args.target)
        speed = {temp: speed_arm(out / arm, arm, temp, args) for temp in TEMPERATURES}
        arms[arm] = arm_entry(arm, out / arm, trained[arm], yard, speed, args.concurrency)
        print(f"# {arm}: tau T=0 {fmt(arms[arm]['tau']['t0'])}, T=1 {fmt(arms[arm]['tau']['t1'])}, draft "
              f"{fmt(arms[arm]['draft_ms_per_cycle'], 1)} ms/cycle", file=sys.stderr)
    result = {"arms": arms, "command": "dflash2 families " + " ".join(argv), "commit": commit,
              "machine": machine_line(machine_info()), "references": REFERENCES}
    result["verdicts"] = verdicts(arms)
    write_json(out / "families.json", result)
    write_text(out / "families.md", render(result, args.concurrency))
    print(f"# wrote {out / 'families.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
