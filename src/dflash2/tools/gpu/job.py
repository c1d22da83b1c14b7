"""The GPU training path (TRAINING.md, "GPU path"): one job that sets up on a machine with no network
from the files it is handed, trains the draft within a wall-clock budget and hands it back in parts.

Contract:
- `python -m dflash2.tools.gpu.job train OUT_DIR [--minutes M] [--config C] [--require-cuda]
  [--parts DIR] [--work DIR] [--data DIR]... [--part-mb N] [--fresh] [section.key=value ...]`
  (`scripts/gpu/train_on_gpu.sh`), in phases, each timed in the summary:
  1. preflight: every package it needs (one line names all missing ones), CUDA when the config
     trains on it or `--require-cuda` is given;
  2. target: unless it was already converted from the same GGUF (sha256), the GGUF's parts
     (`gpu_parts`, `--parts`) are checked and joined and `targets.builtin.convert_gguf` converts
     it into `<work>/cache` (`DFLASH2_CACHE`), where the built-in name resolves to it; its
     fingerprint is compared with the data manifests' (reported, not enforced);
  3. data: the shard directories (`--data`, default every `data/regen/*` made by the target), and
     first, where `--prompts` holds prompts (`tools/gpu/regen.py`) and the run has not started,
     their answers by the target on this machine (`regen.regenerate_phase`: the engine, continuous
     batching, `regen_batch_size` rows, no prompt started after `regen_share` of the budget) into
     `<work>/regen/<target>-device`, which is trained on with the rest;
  4. features: every training sequence's target features and top-k logits into
     `<work>/features` in padded batched passes (`features.fill_features`), cached ones skipped;
  5. train (`run_training`): the first `calibration_steps` steps are timed, then `train.steps` is
     set (at most the config's own count) so the cosine schedule ends inside the budget, and
     written to `<work>/run/gpu_plan.json`; a later call resumes the same plan from the latest
     checkpoint, and a finished run is only packed again. `train.max_wall_seconds` stops training
     in any case `reserve_seconds` before the deadline, so the draft is always exported;
  6. outputs: OUT_DIR gets `final/` as `draft.tar.part-NN` (at most `--part-mb` MiB each) with
     `manifest.json` (`gpu_parts.pack_directory`), the regenerated shards as `data/data.tar.part-NN`
     + `data/manifest.json`, `summary.json`, and `metrics.jsonl`, `curves.png` where there is room:
     at most 8 files, none over 16 MiB. `gpu_parts collect` (`scripts/gpu/collect.sh`) rebuilds it.
  The deadline counts from `$DFLASH2_GPU_T0` (the script's start, epoch seconds) when set.
- `smoke OUT_DIR`: phases 4-6 on a tiny random target and synthetic sequences, then the parts are
  unpacked and the draft must decode exactly as the target alone (greedy): the first device call.
- `check [--parts DIR]`: preflight and the parts' status, one line each.
- Bad input (a missing part, a hash mismatch, no CUDA with `--require-cuda`, a missing package) is
  a one-line `DFlash2Error`: `error: ...` and exit status 2.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dflash2.argparsing import OneLineParser, first_paragraph
from dflash2.errors import DFlash2Error, require
from dflash2.tools.gpu import parts as gpu_parts, regen
from dflash2.tools.gpu.features import fill_features
from dflash2.tools.gpu.parts import MiB, RETURN_LIMIT

MAX_FILES = 8                   # files a device call gives back
NEEDED = {"torch": "torch", "transformers": "transformers", "safetensors": "safetensors", "numpy": "numpy",
          "yaml": "PyYAML", "tqdm": "tqdm", "tokenizers": "tokenizers", "matplotlib": "matplotlib"}


def _say(message: str) -> None:
    print(f"gpu_job: {message}", flush=True)


@dataclass(frozen=True)
class JobSettings:
    out_dir: Path
    minutes: float = 9.0                        # wall-clock budget of the whole job
    config: str = "configs/smollm2-dflash2-gpu.yaml"
    overrides: tuple[str, ...] = ()
    parts_dir: Path = Path(".gpu/parts")
    work_dir: Path = Path(".gpu/work")          # target, features, run: kept between calls
    data: tuple[str, ...] = ()                  # empty: every data/regen/* of the target
    require_cuda: bool = False
    part_bytes: int = 15 * MiB
    reserve_seconds: float = 25.0               # kept after training for export and packing
    calibration_steps: int = 12
    min_train_seconds: float = 60.0             # the least time worth planning a run for
    feature_batch_tokens: int = 32768           # padded tokens per batched target pass (CUDA; 1 on a CPU)
    fresh: bool = False                         # start the run again (target and features kept)
    prompts_dir: Path = Path(".gpu/prompts")    # prompts to answer first (tools/gpu/regen.py); none: no phase
    regen_share: float = 0.4                    # share of the budget the answers may take
    regen_batch_size: int = 256                 # rows decoding at once
    regen_max_new_tokens: int = 256
    started_at: float | None = None             # epoch seconds; None: now

    def __post_init__(self) -> None:
        require(self.minutes > 0, f"--minutes must be positive, got {self.minutes}")
        require(0 < self.part_bytes <= RETURN_LIMIT, f"--part-mb must be in (0, {RETURN_LIMIT // MiB}], got "
                                                     f"{self.part_bytes / MiB:g}")
        require(self.calibration_steps >= 3, "calibration_steps must be at least 3")


class Clock:
    """The job's deadline: `seconds` after `started_at` (epoch seconds; default now)."""

    def __init__(self, seconds: float, started_at: float | None = None):
        self.started_at, self.seconds = time.time() if started_at is None else started_at, seconds

    def left(self) -> float:
        return self.started_at + self.seconds - time.time()


class Phases:
    """Seconds spent per phase, for the summary."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - began, 2)


# ----------------------------------------------------------------------------- 1. preflight
def preflight(need_gguf: bool, need_cuda: bool) -> dict:
    """Versions of what the job needs, or one line naming everything missing."""
    needed = dict(NEEDED, **({"gguf": "gguf"} if need_gguf else {}))
    missing = [dist for module, dist in needed.items() if importlib.util.find_spec(module) is None]
    require(not missing, f"missing Python packages: {', '.join(missing)} (carry them as wheels: "
                         "scripts/gpu/split_target.sh puts gguf and transformers in .gpu/wheels)")
    info = {dist: importlib.metadata.version(dist) for dist in needed.values()}
    pyproject = Path("pyproject.toml")
    pinned = re.search(r'"transformers==([^"]+)"', pyproject.read_text()) if pyproject.is_file() else None
    if pinned and info["transformers"] != pinned.group(1):
        info["warning"] = f"transformers {info['transformers']} here, pinned {pinned.group(1)}"
    import torch

    info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    require(info["cuda"] is not None or not need_cuda,
            f"no CUDA device: torch {torch.__version__} (CUDA build {torch.version.cuda}) sees none, and this job "
            "trains on CUDA (--require-cuda or train.device=cuda)")
    return info


# ----------------------------------------------------------------------------- 2. target
def prepare_target(name: str, parts_dir: Path, work_dir: Path) -> dict:
    """Built-in target `name` converted into `<work>/cache` from the GGUF's parts (or reused)."""
    from dflash2.targets import builtin

    destination = builtin.builtin_dir(name)
    record_path = destination / builtin.SOURCE_RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else None
    has_parts = (parts_dir / gpu_parts.MANIFEST).is_file()
    if not has_parts:
        if record is not None:
            return {"reused": True, "gguf_sha256": record.get("gguf_sha256")}
        require(importlib.util.find_spec(builtin.BUILTIN_TARGETS[name].package.replace("-", "_")) is not None,
                f"no GGUF parts in '{parts_dir}' and target '{name}' is not converted here: upload the parts "
                "(scripts/gpu/split_target.sh prints the device calls)")
        builtin.convert_builtin(name)
        return {"reused": False, "source": "package"}
    manifest = gpu_parts.read_manifest(parts_dir)
    require(manifest.get("target", name) == name,
            f"the parts in '{parts_dir}' are target '{manifest.get('target')}', the config trains for '{name}'")
    if record is not None and record.get("gguf_sha256") == manifest["sha256"]:
        return {"reused": True, "gguf_sha256": manifest["sha256"]}
    joined, began = work_dir / "gguf" / manifest["file"], time.perf_counter()
    gpu_parts.join_parts(parts_dir, joined)
    _say(f"joined {len(manifest['parts'])} parts ({manifest['size'] / 1e6:.1f} MB, sha256 verified) in "
         f"{time.perf_counter() - began:.1f} s")
    builtin.convert_gguf(joined, destination, name=name, force=True)
    joined.unlink()
    return {"reused": False, "source": "parts", "gguf_sha256": manifest["sha256"], "parts": len(manifest["parts"])}


def _made_by(directory: str | Path) -> dict:
    """The `target` record of a shard directory's manifest ({} if it has none)."""
    try:
        return json.loads((Path(directory) / "manifest.json").read_text()).get("target") or {}
    except (OSError, ValueError):
        return {}


def data_dirs(target_name: str, root: Path = Path("data/regen")) -> list[str]:
    """Every shard directory under `root` whose manifest says it was made by `target_name`."""
    found = [str(m.parent) for m in sorted(root.glob("*/manifest.json")) if _made_by(m.parent).get("name") == target_name]
    require(bool(found), f"no data directory of target '{target_name}' under '{root}' (give --data DIR)")
    return found


def fingerprint_matches(name: str, model, dirs: list[str]) -> dict:
    """Whether the converted target is the one that regenerated each data directory."""
    from dflash2.training.data_identity import target_fields

    mine = target_fields(name, model)
    return {Path(d).name: all(_made_by(d).get(k) == mine[k] for k in ("config_sha256", "weights_fingerprint"))
            for d in dirs}


# ----------------------------------------------------------------------------- 5. train
def _with_train(cfg, **changes):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))


def _timed(trainer, method: str, durations: list[float]) -> None:
    """Record the wall time of every call of `trainer.<method>` (calibration only)."""
    inner = getattr(trainer, method)

    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        out = inner(*args, **kwargs)
        durations.append(time.perf_counter() - began)
        return out

    setattr(trainer, method, wrapper)


def _budgeted(trainer, clock: Clock, reserve: float) -> None:
    budget = max(1.0, clock.left() - reserve)
    trainer.cfg = _with_train(trainer.cfg, max_wall_seconds=budget)


def run_training(cfg, clock: Clock, settings: JobSettings, target_model, tokenizer, sequences,
                 phases: Phases) -> dict:
    """Phases 4 and 5 for `cfg` (its `train.output_dir` is the run): features, calibration,
    training to the plan within the deadline. Returns {"status", "features", "plan", "train"}."""
    from dflash2.training.trainer import Trainer

    run_dir = Path(cfg.train.output_dir)
    plan_path = run_dir / "gpu_plan.json"
    if settings.fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    plan = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    has_checkpoint = (run_dir / "checkpoints" / "latest").is_file()
    done = run_dir / "summary.json"
    if plan and done.is_file() and json.loads(done.read_text()).get("steps") == plan["steps"]:
        _say(f"the run in {run_dir} already finished its {plan['steps']} steps: packing it again")
        return {"status": "finished earlier", "plan": plan, "train": json.loads(done.read_text())}

    def make(steps):
        return Trainer(_with_train(cfg, steps=steps), target_model=target_model, tokenizer=tokenizer,
                       train_sequences=sequences)

    require(bool(cfg.data.feature_cache_dir), "config key 'data.feature_cache_dir' must be set for the GPU job")
    trainer = phases.run("build", make, plan["steps"] if plan else cfg.train.steps)
    try:
        features = phases.run("features", fill_features, trainer, cfg, sequences, clock, settings.reserve_seconds,
                              settings.feature_batch_tokens)
        _say(f"features: {features}")
        if not features["complete"]:
            return {"status": "features incomplete: run the job again", "features": features, "plan": plan}
        if plan is None and clock.left() - settings.reserve_seconds < settings.min_train_seconds:
            return {"status": "features cached, too little time left to plan the training: run the job again",
                    "features": features, "plan": plan}
        if has_checkpoint:
            trainer.resume()
        if plan is None:
            cap, k = trainer.total_steps, settings.calibration_steps
            steps_s, saves_s = [], []
            _timed(trainer, "train_step", steps_s)
            _timed(trainer, "save", saves_s)
            _budgeted(trainer, clock, settings.reserve_seconds)
            summary = phases.run("calibrate", trainer.train, stop_at=min(cap, trainer.step + k))
            step_s = statistics.median(steps_s[2:] or steps_s)
            save_s = max(saves_s or [0.0])
            per_step = step_s * 1.05 + save_s / (cfg.train.checkpoint_every or cap)
            more = int((clock.left() - settings.reserve_seconds - save_s) / per_step)
            exported = "final_dir" in summary  # the schedule's end or the wall-clock budget came first
            plan = {"steps": trainer.step if exported else max(trainer.step, min(cap, trainer.step + more)),
                    "cap": cap, "step_seconds": round(step_s, 4), "save_seconds": round(save_s, 3),
                    "calibrated_at_step": trainer.step}
            run_dir.mkdir(parents=True, exist_ok=True)
            plan_path.write_text(json.dumps(plan, indent=2) + "\n")
            _say(f"plan: {plan}")
            if not exported:
                trainer.close()
                trainer = phases.run("build", make, plan["steps"])
                trainer.resume()
        else:
            exported = False
        if not exported:
            _budgeted(trainer, clock, settings.reserve_seconds)
            summary = phases.run("train", trainer.train)
    finally:
        trainer.close()
    finished = summary["steps"] >= plan["steps"]
    status = "finished" if finished else "stopped by the wall-clock budget: run the job again to continue"
    return {"status": status, "features": features, "plan": plan, "train": summary}


# ----------------------------------------------------------------------------- 6. outputs
def write_outputs(run_dir: Path, out_dir: Path, part_bytes: int, summary: dict, data_dir: Path | None = None) -> list[str]:
    """The exported draft in parts, the regenerated shards (`data_dir`, packed into `out_dir/data`),
    the metrics and the summary into `out_dir` (at most 8 files; the curves and metrics only where
    there is room)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / "final"
    require((final / "config.json").is_file(), f"no exported draft in '{final}' (training did not finish a step)")
    manifest = gpu_parts.pack_directory(final, out_dir, part_bytes)
    names = [p["name"] for p in manifest["parts"]] + [gpu_parts.MANIFEST]
    if data_dir is not None and (data_dir / "manifest.json").is_file():
        packed = regen.pack_data(data_dir, out_dir / "data", part_bytes)
        names += [f"data/{p['name']}" for p in packed["parts"]] + [f"data/{gpu_parts.MANIFEST}"]
        summary = dict(summary, data_sha256=packed["sha256"])
    for extra in ("metrics.jsonl", "curves.png"):  # the curves can be redrawn here from the metrics
        source = run_dir / extra
        if source.is_file() and source.stat().st_size <= RETURN_LIMIT and len(names) + 2 <= MAX_FILES:
            shutil.copyfile(source, out_dir / extra)
            names.append(extra)
    summary = dict(summary, outputs={"files": names + ["summary.json"], "draft_sha256": manifest["sha256"],
                                     "draft_bytes": manifest["size"]})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    names.append("summary.json")
    require(len(names) <= MAX_FILES, f"{len(names)} output files, a device call gives back {MAX_FILES}: raise --part-mb")
    return names


def check_lossless(target_model, draft_dir: Path, prompts: list[list[int]], max_new_tokens: int = 12) -> bool:
    """Whether speculative greedy decoding with the draft in `draft_dir` equals plain decoding."""
    from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
    from dflash2.decoding.verifier.adapter import TargetAdapter
    from dflash2.model.draft import DFlash2DraftModel

    device = next(target_model.parameters()).device
    draft = DFlash2DraftModel.from_pretrained(draft_dir, device=device)
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    spec = SpeculativeDecoder(TargetAdapter(target_model, draft.config.target_layer_ids), draft, "always")
    plain = spec.variant(speculate="never")
    return [r.tokens for r in spec.generate(prompts, config)] == [r.tokens for r in plain.generate(prompts, config)]


# ----------------------------------------------------------------------------- the commands
def train_job(settings: JobSettings) -> dict:
    """The `train` command (phases 1-6); returns the summary written to OUT_DIR."""
    import torch

    from dflash2.training.config import load_config
    from dflash2.training.dataset import load_sequences
    from dflash2.training.trainer import autocast_dtype

    clock, phases = Clock(settings.minutes * 60, settings.started_at), Phases()
    work = settings.work_dir.resolve()
    os.environ["DFLASH2_CACHE"] = str(work / "cache")
    cfg = load_config(settings.config, list(settings.overrides))
    name = cfg.target.name
    from dflash2.targets.builtin import BUILTIN_TARGETS, is_converted
    require(name in BUILTIN_TARGETS, f"config key 'target.name' must be a built-in target here, got '{name}'")
    need_cuda = settings.require_cuda or cfg.train.device == "cuda"
    info = phases.run("preflight", preflight, need_gguf=not is_converted(name), need_cuda=need_cuda)
    _say(f"preflight: {info}")
    target = phases.run("target", prepare_target, name, settings.parts_dir, work)
    dirs = list(settings.data) or data_dirs(name)
    from dflash2.targets.builtin import load_target

    model, tokenizer = phases.run("load target", load_target, name)
    target["matches_data"] = fingerprint_matches(name, model, dirs)
    device = torch.device("cuda" if cfg.train.device != "cpu" and torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        model = model.to(device, torch.bfloat16 if autocast_dtype(cfg.train.precision, device) else torch.float32)
    regen_dir, started = work / "regen" / f"{name}-device", (work / "run" / "checkpoints").is_dir() and not settings.fresh
    if (settings.prompts_dir / regen.PROMPTS_RECORD).is_file() and not started:  # answers first, then train on all
        deadline = clock.started_at + settings.regen_share * clock.seconds
        target["regenerate"] = phases.run("regenerate", regen.regenerate_phase, model, tokenizer, name,
                                          settings.prompts_dir, regen_dir, deadline, settings.regen_batch_size,
                                          settings.regen_max_new_tokens)
    if (regen_dir / "manifest.json").is_file():
        dirs.append(str(regen_dir))
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=tuple(dirs),
                                                            feature_cache_dir=str(work / "features")),
                              train=dataclasses.replace(cfg.train, output_dir=str(work / "run"), progress=False))
    sequences, counts = phases.run("data", load_sequences, dirs, cfg.data.max_seq_len, cfg.data.exclude_holdout)
    _say(f"target {target}; data {counts} from {', '.join(dirs)}")
    if device.type == "cpu":  # a CPU computes padding too: one unpadded pass per sequence is cheaper there
        settings = dataclasses.replace(settings, feature_batch_tokens=1)
    result = run_training(cfg, clock, settings, model, tokenizer, sequences, phases)
    summary = {"status": result["status"], "preflight": info, "target": target, "data": {"dirs": dirs, **counts},
               "features": result.get("features"), "plan": result.get("plan"), "train": result.get("train"),
               "seconds": phases.seconds, "wall_seconds": round(time.time() - clock.started_at, 1),
               "config": cfg.to_dict(), "overrides": list(settings.overrides)}
    if result.get("train") is None:
        settings.out_dir.mkdir(parents=True, exist_ok=True)
        (settings.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary
    phases.run("outputs", write_outputs, work / "run", settings.out_dir, settings.part_bytes, summary,
               regen_dir if (regen_dir / "manifest.json").is_file() else None)
    return json.loads((settings.out_dir / "summary.json").read_text())


def synthetic_sequences(n: int, vocab: int, seed: int = 0):
    """(input_ids, loss_mask) pairs: a short unsupervised prompt, then a repeated motif."""
    import torch

    g, out = torch.Generator().manual_seed(seed), []
    for _ in range(n):
        length, prompt, period = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((20, 40), (3, 8), (2, 5)))
        motif = torch.randint(3, vocab - 2, (period,), generator=g)
        ids = torch.cat([torch.randint(3, vocab - 2, (prompt,), generator=g), motif.repeat(length)])[:length]
        out.append((ids, torch.arange(length) >= prompt))
    return out


def smoke_job(settings: JobSettings, seconds: float = 30.0) -> dict:
    """Phases 4-6 on a tiny random target, then unpack and check the draft decodes losslessly."""
    import torch

    from dflash2.targets.tiny import tiny_target
    from dflash2.training.config import TrainConfig

    clock, phases = Clock(seconds), Phases()
    info = preflight(need_gguf=True, need_cuda=settings.require_cuda)  # the first device call: say all that is missing
    work = settings.work_dir.resolve() / "smoke"
    shutil.rmtree(work, ignore_errors=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target = tiny_target("llama").to(device)
    sequences = synthetic_sequences(16, target.config.vocab_size)
    cfg = TrainConfig.from_dict({
        "draft": {"num_layers": 2, "selector_rank": 8, "selector_top_k": 8, "conv_group_size": 16},
        "loss": {"num_anchors": 4, "logits_chunk": 16, "distill_weight": 0.5, "distill_top_k": 4},
        "data": {"max_seq_len": 64, "feature_cache_dir": str(work / "features")},
        "train": {"steps": 400, "batch_size": 4, "log_every": 2, "checkpoint_every": 10, "output_dir": str(work / "run"),
                  "progress": False, "precision": "auto", "device": device}})
    smoke = dataclasses.replace(settings, reserve_seconds=min(settings.reserve_seconds, seconds / 3),
                                calibration_steps=4, min_train_seconds=0.0, fresh=True)
    result = run_training(cfg, clock, smoke, target, None, sequences, phases)
    names = write_outputs(work / "run", settings.out_dir, settings.part_bytes, {"status": result["status"]})
    collected = work / "collected"
    gpu_parts.unpack_parts(settings.out_dir, collected)
    prompts = [sequences[0][0][:6].tolist(), sequences[1][0][:9].tolist()]
    lossless = check_lossless(target, collected, prompts)
    require(lossless, "smoke: the collected draft does not decode exactly as the target alone")
    summary = {"status": "smoke passed", "preflight": info, "device": device, "plan": result["plan"],
               "steps": result["train"]["steps"], "files": names, "seconds": phases.seconds}
    (settings.out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _check(settings: JobSettings) -> int:
    """Preflight and the parts' status, one line each (what the upload calls run)."""
    failed = None
    try:
        print(f"preflight: {json.dumps(preflight(need_gguf=True, need_cuda=settings.require_cuda))}")
    except DFlash2Error as err:
        failed = err
        print(f"preflight failed: {err}")
    has_parts = (settings.parts_dir / gpu_parts.MANIFEST).is_file()
    print(gpu_parts.parts_status(settings.parts_dir).line() if has_parts else f"no parts in '{settings.parts_dir}' yet")
    if failed is not None:
        raise failed
    return 0


def _settings(args) -> JobSettings:
    started = os.environ.get("DFLASH2_GPU_T0")
    return JobSettings(out_dir=Path(args.out_dir), minutes=args.minutes, config=args.config,
                       overrides=tuple(args.overrides), parts_dir=Path(args.parts), work_dir=Path(args.work),
                       data=tuple(args.data or ()), require_cuda=args.require_cuda, part_bytes=int(args.part_mb * MiB),
                       fresh=args.fresh, started_at=float(started) if started else None,
                       prompts_dir=Path(args.prompts))


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m dflash2.tools.gpu.job", description=first_paragraph(__doc__))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for command in ("train", "smoke", "check"):
        p = sub.add_parser(command)
        if command != "check":
            p.add_argument("out_dir", help="where the draft's parts, metrics and summary go ($OUT on the device)")
        p.add_argument("--require-cuda", action="store_true", help="refuse to run without a CUDA device")
        p.add_argument("--parts", default=".gpu/parts", help="the target GGUF's parts (default .gpu/parts)")
        p.add_argument("--work", default=".gpu/work", help="target, features and run, kept between calls")
        p.add_argument("--part-mb", type=float, default=15.0, help="largest output part in MiB (default 15)")
        p.add_argument("--minutes", type=float, default=9.0 if command == "train" else 0.5,
                       help="wall-clock budget from the start of the job")
        p.add_argument("--config", default="configs/smollm2-dflash2-gpu.yaml")
        p.add_argument("--data", action="append", help="a shard directory, repeatable (default: every data/regen/* of the target)")
        p.add_argument("--fresh", action="store_true", help="start the run again (the target and features are kept)")
        p.add_argument("--prompts", default=".gpu/prompts", help="prompts to answer before training (tools/gpu/regen.py)")
    try:
        args, extra = parser.parse_known_args(argv)  # `train` takes dotted overrides anywhere: loss.distill_weight=0.5
        bad = [item for item in extra if args.command != "train" or not re.fullmatch(r"\w+\.\w+=.*", item)]
        require(not bad, f"unrecognized arguments: {' '.join(bad)}")
        args.overrides = extra
        if args.command == "check":
            args.out_dir = "."
            return _check(_settings(args))
        if args.command == "smoke":
            summary = smoke_job(_settings(args), seconds=args.minutes * 60)
        else:
            summary = train_job(_settings(args))
    except DFlash2Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary.get(k) for k in ("status", "seconds", "plan", "outputs", "files") if k in summary},
                     default=str))
    return 0 if summary.get("outputs") or summary.get("files") else 3   # 3: no draft yet, run it again


if __name__ == "__main__":
    sys.exit(main())
