"""`dflash2 ablation CONFIG.yaml`: the equal-budget component ablation (docs/spec.md §1, §4).

Contract:
- Arms (`ARMS`): DFlash v1 (no selector, no convs), v1 + selector, v1 + convs, DFlash2 (both). Every
  arm trains from the SAME config (`CONFIG.yaml` plus the `key=value` overrides: same data, steps,
  batch, seed, schedule); only `draft.use_selector` / `draft.use_conv` differ. Arm `a` trains into
  `OUTPUT/a` (`train.output_dir` is set per arm) and is then measured with `dflash2 bench
  --no-baseline` (real speculative decoding on the target, acceptance length only) at T=0 and at
  the official T=1 (top-p 0.95, top-k 20) on `--datasets` x `--num-prompts` prompts (at T=1
  `--t1-num-prompts`, if given), in `OUTPUT/a/bench-t0` and `OUTPUT/a/bench-t1`.
- `--train-only` stops once every arm is trained, so that all of them are measured later on the
  same quiet machine (a run without it reuses the trained arms).
- Resumable: an arm whose `final/` exists is not retrained, a bench whose results.json exists is
  not rerun (delete them to redo). An arm trained with another config (any key but those in
  `REUSE_FREE`, which do not change what is trained: the budget keys count) is refused in one line
  (`check_trained_arm`). Training wall time is recorded per arm when it trains.
- Writes `OUTPUT/ablation.json`, `OUTPUT/ablation.md` (tau per dataset and mean, T=0 and T=1;
  training steps, tokens, time; last teacher-forced metrics) and `OUTPUT/ablation-curves.png`
  (teacher-forced acceptance length vs training tokens, one line per arm).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml

from dflash2.argparsing import ModelSettings, OneLineParser, parse_list
from dflash2.data.prompts import load_conversations
from dflash2.eval import bench
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_write, check_output, fmt, markdown_table, write_json, write_text
from dflash2.pipeline import build_pipeline
from dflash2.runtime.provenance import git_commit, machine_info, machine_line
from dflash2.training.config import load_config
from dflash2.training.preflight import check_inputs
from dflash2.training.trainer import Trainer, config_difference

ARMS = {  # name -> (use_selector, use_conv)
    "dflash-v1": (False, False),
    "v1+selector": (True, False),
    "v1+convs": (False, True),
    "dflash2": (True, True),
}
TEMPERATURES = {"t0": {"temperature": 0.0}, "t1": {"temperature": 1.0, "top_p": 0.95, "top_k": 20}}
REUSE_FREE = {"train.output_dir", "train.progress", "train.log_every", "train.eval_every", "train.checkpoint_every",
              "train.keep_checkpoints", "train.device", "data.feature_cache_dir", "data.max_eval_sequences"}


def arm_overrides(arm: str) -> list[str]:
    use_selector, use_conv = ARMS[arm]
    return [f"draft.use_selector={str(use_selector).lower()}", f"draft.use_conv={str(use_conv).lower()}"]


def train_arm(config_path: str, overrides: list[str], arm: str, out: Path, own: list[str] | None = None) -> dict:
    """Train one arm (unless its final/ exists) -> {"seconds": ..., "summary": ...}. `own`: the arm's
    own overrides (default: its `ARMS` switches), applied after the shared ones."""
    run_dir = out / arm
    record = run_dir / "ablation-train.json"
    cfg = load_config(config_path, [*overrides, *(arm_overrides(arm) if own is None else own),
                                    f"train.output_dir={run_dir}"])
    if (run_dir / "final").is_dir() and record.is_file():
        check_trained_arm(run_dir, cfg)
        return json.loads(record.read_text())
    print(f"# training {arm}", file=sys.stderr)
    trainer = Trainer(cfg)
    clock = time.perf_counter()
    try:
        summary = trainer.train(resume=(run_dir / "checkpoints").is_dir())
    finally:
        trainer.close()
    result = {"seconds": time.perf_counter() - clock, "summary": summary, "data": trainer.data_counts}
    with atomic_write(record, "w") as handle:
        json.dump(result, handle, indent=2)
    return result


def check_trained_arm(run_dir: Path, cfg) -> None:
    """One line unless the finished arm in `run_dir` was trained with `cfg` (keys in `REUSE_FREE` aside)."""
    trained = yaml.safe_load((run_dir / "train_config.yaml").read_text())
    difference = config_difference(trained, cfg.to_dict(), REUSE_FREE)
    if difference is not None:
        key, asked, was = difference
        raise DFlash2Error(f"{run_dir} was trained with config key '{key}' = {was!r}, and this run asks for {asked!r}: "
                           "give the same config and overrides to reuse it, or delete it to train again")


def bench_arm(arm_dir: Path, temperature: str, args) -> dict:
    out = arm_dir / f"bench-{temperature}"
    if (out / "results.json").is_file():
        return json.loads((out / "results.json").read_text())
    prompts = args.t1_num_prompts if temperature == "t1" and args.t1_num_prompts else args.num_prompts
    model = ModelSettings(target=args.target, draft=str(arm_dir / "final"), speculate="always", seed=0, proposer="draft",
                          lattice=False)
    settings = bench.BenchSettings(model, tuple(parse_list(args.datasets, "--datasets")), num_prompts=prompts,
                                   max_new_tokens=args.max_new_tokens, baseline=False,
                                   concurrency=(int(args.concurrency),), output=str(out),
                                   **TEMPERATURES[temperature]).validate()
    return bench.run_bench(build_pipeline(model), settings)


def curve(metrics_path: Path) -> list[tuple[int, float]]:
    """(training tokens, teacher-forced tau) of every logged train record."""
    points = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        if record.get("split") == "train":
            points.append((record["tokens"], record["tau"]))
    return points


def plot_curves(curves: dict[str, list[tuple[int, float]]], png: Path) -> None:
    import matplotlib   # plotting only: loaded when a figure is drawn, not for every command's start-up

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    try:
        for arm, points in curves.items():
            if points:
                ax.plot([p[0] / 1e6 for p in points], [p[1] for p in points], label=arm, marker=".", markersize=3)
        ax.set_xlabel("training tokens (millions, prompt + response)")
        ax.set_ylabel("teacher-forced acceptance length")
        ax.set_title("Equal-budget ablation: learning curves")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=110)
    finally:
        plt.close(fig)


def measured_on(result: dict, temp: str) -> str:
    """The prompt / token counts of one temperature's benches (every arm's, if they differ)."""
    return "; ".join(sorted({entry[temp]["measured_on"] for entry in result["arms"].values()}))


def report(out: Path, arms: list[str], trained: dict, benches: dict, datasets: list[str], command: str) -> dict:
    rows, result = [], {"arms": {}, "datasets": datasets, "command": command, "commit": git_commit(),
                        "machine": machine_line(machine_info())}
    for arm in arms:
        summary = trained[arm]["summary"]
        last = summary.get("last", {})
        entry = {"train_seconds": trained[arm]["seconds"], "steps": summary["steps"], "tokens": summary["tokens"],
                 "teacher_forced_tau": last.get("tau"), "teacher_forced_tau_base": last.get("tau_base")}
        for temp, results in benches[arm].items():
            entry[temp] = {name: results["datasets"][name]["acceptance_length"] for name in datasets}
            entry[temp]["mean"] = results["overall"]["mean_over_datasets"]
            settings = results["settings"]
            entry[temp]["measured_on"] = f"{settings['num_prompts']} prompts per dataset, {settings['max_new_tokens']} new tokens"
        result["arms"][arm] = entry
        rows.append([arm] + [entry["t0"][n] for n in datasets] + [entry["t0"]["mean"], entry["t1"]["mean"],
                     entry["teacher_forced_tau"], entry["steps"], entry["tokens"], entry["train_seconds"] / 60])
    headers = ["arm"] + [f"{n} T=0" for n in datasets] + ["mean T=0", "mean T=1", "teacher-forced tau",
                                                        "steps", "tokens", "train min"]
    t1_rows = [[arm] + [result["arms"][arm]["t1"][n] for n in datasets] + [result["arms"][arm]["t1"]["mean"]]
               for arm in arms]
    text = "\n".join([
        "# Equal-budget ablation\n", f"- command: `{command}`", f"- commit {result['commit']}; {result['machine']}",
        "- tau = acceptance length of real speculative decoding (bonus counted) with `dflash2 bench --no-baseline`\n",
        f"## T=0 ({measured_on(result, 't0')})\n", markdown_table(headers, rows),
        f"## T=1, top-p 0.95, top-k 20 ({measured_on(result, 't1')})\n",
        markdown_table(["arm"] + datasets + ["mean"], t1_rows), "![curves](ablation-curves.png)\n"])
    write_text(out / "ablation.md", text)
    write_json(out / "ablation.json", result)
    return result


def arms_parser(prog: str, description: str, arms, output: str) -> OneLineParser:
    """The options of every equal-budget comparison of arms: a base config, overrides for every
    arm, which arms, where to write, the target and the benchmark sets."""
    p = OneLineParser(prog=prog, description=description)
    p.add_argument("config", help="base YAML training config (e.g. configs/smollm2-dflash2.yaml)")
    p.add_argument("overrides", nargs="*", help="dotted overrides applied to every arm, e.g. train.steps=150")
    p.add_argument("--arms", default=",".join(arms), help=f"comma list of {', '.join(arms)}")
    p.add_argument("--output", default=output)
    p.add_argument("--target", default="smollm2")
    p.add_argument("--datasets", default="gsm8k,math500,humaneval,mbpp,mt-bench")
    p.add_argument("--train-only", action="store_true",
                   help="train the arms and stop: measure them later, every arm on the same quiet machine")
    return p


def trained_only(arms: list[str]) -> int:
    print(f"# trained {', '.join(arms)} (--train-only): run again without it to measure them", file=sys.stderr)
    return 0


def chosen_arms(text: str, known) -> list[str]:
    arms = parse_list(text, "--arms")
    unknown = [a for a in arms if a not in known]
    require(not unknown, f"--arms: unknown arm '{unknown[0] if unknown else ''}' (choose from {', '.join(known)})")
    return arms


def main(argv: list[str] | None = None) -> int:
    p = arms_parser("dflash2 ablation", "Equal-budget ablation: DFlash v1, +selector, +convs, DFlash2 trained "
                    "alike and measured by real speculative decoding.", ARMS, "runs/ablation")
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--t1-num-prompts", type=int, default=None, help="prompts per dataset at T=1 (default: --num-prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_intermixed_args(argv)  # overrides and options in any order
    arms = chosen_arms(args.arms, ARMS)
    for flag, value in (("--concurrency", args.concurrency), ("--num-prompts", args.num_prompts),
                        ("--t1-num-prompts", args.t1_num_prompts), ("--max-new-tokens", args.max_new_tokens)):
        # the benches use these only after every arm has trained: check them before the first
        require(value is None or value > 0, f"{flag} must be a positive integer, got {value}")
    check_inputs(load_config(args.config, args.overrides))  # bad config values and data fail here, before any training
    load_conversations(parse_list(args.datasets, "--datasets"), args.num_prompts)
    check_output(args.output)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    trained = {arm: train_arm(args.config, args.overrides, arm, out) for arm in arms}
    if args.train_only:
        return trained_only(arms)
    benches = {arm: {temp: bench_arm(out / arm, temp, args) for temp in TEMPERATURES} for arm in arms}
    plot_curves({arm: curve(out / arm / "metrics.jsonl") for arm in arms}, out / "ablation-curves.png")
    command = "dflash2 ablation " + " ".join(argv if argv is not None else sys.argv[1:])
    result = report(out, arms, trained, benches, parse_list(args.datasets, "--datasets"), command)
    for arm, entry in result["arms"].items():
        print(f"# {arm}: tau T=0 {fmt(entry['t0']['mean'])}, T=1 {fmt(entry['t1']['mean'])}", file=sys.stderr)
    return 0
