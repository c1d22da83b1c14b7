"""The training loop: `dflash2 train CONFIG.yaml [section.key=value ...] [--resume]`.

Contract:
- `Trainer(cfg, target_model=None, tokenizer=None, train_sequences=None, eval_sequences=None)`
  loads the target (`load_target(cfg.target.name)`, frozen) unless given, builds the draft
  (`model.build_draft`), reads the shard directories of `data.train` / `data.eval` unless
  sequences ((input_ids, loss_mask) pairs) are given, and sets up AdamW (lr, betas, eps, weight
  decay from `optim`), a schedule of linear warmup over `warmup_fraction` of the steps then cosine
  down to `min_lr_ratio` x lr, and gradient clipping at `grad_clip` (`clip_groups`: the selector
  is clipped on its own when its loss does not reach the backbone).
- One optimiser step = `train.batch_size` sequences (global, over all ranks), split evenly across
  ranks and then into `grad_accum` micro-batches; which sequences and which anchors a step uses
  depend only on (seed, step) (`data.SequenceOrder`, `batches.anchor_generator`); with
  `loss.replay_fraction` > 0 (one process) a step ends with one more micro-batch, of replay rows:
  blocks earlier steps rejected (`training.replay`: the buffer is updated after each forward and
  saved in every checkpoint, so it too depends only on (seed, step); `tokens` counts the data's
  rows only). The loss of
  every micro-batch is divided by the step's global label-weight sum, so 1 process, N ranks and
  any accumulation give the same update (up to float summation order).
- `train(resume=False)` runs to `train.steps` (or `train.epochs` over the data), logging metrics
  to `<output_dir>/metrics.jsonl` every `log_every` steps (`curves.png` is redrawn at each
  checkpoint), evaluating every `eval_every` steps, checkpointing every `checkpoint_every` steps
  and at the end, then exporting
  `<output_dir>/final` in `save_dtype`. `train.max_cpu_seconds` (this process's CPU time) and
  `train.max_wall_seconds` (wall-clock time since `train()` began; the run stops at the step
  boundary from which one more step would end past it) end a run early: that step is the last,
  checkpointed and exported as at the end. `resume=True` restores the latest checkpoint (weights,
  optimizer, scheduler, step, token count, RNG) and continues on exactly the trajectory of an
  uninterrupted run. A resumed run's config must match the checkpoint's, except for the keys in
  `RESUMABLE_CHANGES` (`config_difference(saved, current, free)`: the first key that differs). Returns
  a summary dict.
- `main(argv)` is the CLI entry (`dflash2.cli` dispatches `train` here). Before the target loads
  it checks the inputs and the run directory (`preflight`: an existing run is continued only
  with `--resume` and started again only with `--overwrite`, which removes only the run's own
  files; a killed run's temporary directories are cleaned up); under
  `torchrun --nproc_per_node N` it trains data-parallel (`train.parallel`: ddp or fsdp).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from dflash2.argparsing import OneLineParser
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_write
from dflash2.runtime.devices import native_bfloat16
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.training import checkpoints as ckpt
from dflash2.training.batches import Example, build_batch
from dflash2.training.config import TrainConfig, load_config
from dflash2.training.dataset import SequenceOrder, load_sequences, to_pair
from dflash2.training.distributed import Dist
from dflash2.training.features import FeatureSource, TargetSignals, cache_tag
from dflash2.training.losses import LossStats, Teacher
from dflash2.training.metrics_log import MetricsLog, plot_curves
from dflash2.training.draft_step import build_draft, clip_groups, training_module
from dflash2.training.preflight import RUN_FILES, check_data_weights, check_inputs, prepare_run_dir
from dflash2.training.replay import ReplayBuffer, ReplaySettings, fresh_anchors, require_one_process
from dflash2.training.weighting import step_share

RESUMABLE_CHANGES = {"train.steps", "train.progress", "train.log_every", "train.eval_every",
                     "train.checkpoint_every", "train.keep_checkpoints", "train.save_dtype", "train.device",
                     "data.feature_cache_dir", "data.max_eval_sequences", "data.eval", "train.max_cpu_seconds",
                     "train.max_wall_seconds"}
# Keys added after checkpoints were already written: what a checkpoint without the key was trained with.
LEGACY_VALUES = {"optim.clip_selector_separately": False, "data.exclude_holdout": False,
                 "loss.distill_weight": 0.0, "loss.distill_top_k": 32, "loss.position_weighting": "decay",
                 "loss.dpace_alpha": 0.5, "loss.selector_weighting": "decay", "loss.selector_gold": False,
                 "loss.acceptance_weight": 0.0, "loss.replay_fraction": 0.0, "loss.replay_capacity": 2048,
                 "loss.replay_max_accepted": 1, "loss.replay_max_times": 1,
                 "draft.family": "dflash2"}


def lr_factor(step: int, total: int, warmup_fraction: float, min_ratio: float) -> float:
    """Multiplier of the base lr for optimiser step `step` (0-based)."""
    warmup = round(warmup_fraction * total)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """`train.precision` -> the autocast dtype (None = plain fp32). `auto` is bf16 on CUDA and on CPUs
    with native bf16 matmul (where bf16 steps are faster: TRAINING.md), fp32 elsewhere."""
    if precision == "auto":
        fast = device.type in ("cuda", "cpu") and native_bfloat16(str(device))[0]
        precision = "bf16" if fast else "fp32"
    return torch.bfloat16 if precision == "bf16" else None


class Trainer:
    def __init__(self, cfg: TrainConfig, *, target_model=None, tokenizer=None, train_sequences=None,
                 eval_sequences=None, dist: Dist | None = None):
        self.cfg = cfg
        t, d = cfg.train, cfg.data
        self.dist = dist or Dist.from_env(t.device)
        device = self.dist.device
        self.autocast_dtype = autocast_dtype(t.precision, device)
        target_dtype = torch.bfloat16 if (self.autocast_dtype and device.type == "cuda") else torch.float32
        if target_model is None:
            from dflash2.targets.builtin import load_target
            target_model, tokenizer = load_target(cfg.target.name, device=device, dtype=target_dtype)
        target_model = target_model.to(device).eval().requires_grad_(False)
        if train_sequences is None:
            require(bool(d.train), "config key 'data.train' must list at least one shard directory")
            check_data_weights(cfg.target.name, target_model, [*d.train, *d.eval])
            train_sequences, self.data_counts = load_sequences(d.train, d.max_seq_len, d.exclude_holdout)
        else:
            train_sequences = [to_pair(ids, mask, d.max_seq_len) for ids, mask in train_sequences]
            self.data_counts = {"records": len(train_sequences)}
        if eval_sequences is None and d.eval:
            eval_sequences, _ = load_sequences(d.eval, d.max_seq_len)
        self.eval_sequences = [to_pair(i, m, d.max_seq_len) for i, m in (eval_sequences or [])]
        self.eval_sequences = self.eval_sequences[:d.max_eval_sequences]
        self.draft, self.build_report = build_draft(cfg, target_model, tokenizer, train_sequences)
        self.draft.to(device)  # the borrowed embedding and LM head move with it
        self.adapter = TargetAdapter(target_model, self.draft.config.target_layer_ids)
        top_k = cfg.loss.distill_top_k if cfg.loss.distill_weight > 0 or cfg.loss.acceptance_weight > 0 else 0
        tag = cache_tag(cfg.target.name, self.draft.config.target_layer_ids, target_dtype, d.max_seq_len)
        self.features = FeatureSource(self.adapter, d.feature_cache_dir, tag, top_k=top_k)
        per_step = self.dist.world * t.grad_accum
        require(t.batch_size % per_step == 0,
                f"config key 'train.batch_size'={t.batch_size} must be a multiple of world size x grad_accum "
                f"= {self.dist.world} x {t.grad_accum}")
        self.train_sequences = train_sequences
        self.order = SequenceOrder(train_sequences, t.batch_size, t.seed)
        self.total_steps = t.steps or max(1, int(t.epochs * self.order.steps_per_epoch))

        require_one_process(cfg.loss.replay_fraction, self.dist.world)
        self.replay = ReplayBuffer(ReplaySettings.from_section(cfg.loss)) if cfg.loss.replay_fraction > 0 else None
        self.module = training_module(cfg, self.draft, target_model).to(device)
        self.wrapped = self.dist.wrap(self.module, t.parallel)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.clip_groups = clip_groups(self.module, separate_selector=cfg.optim.clip_selector_separately
                                       and not cfg.loss.selector_grad_to_backbone)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.params, lr=o.lr, betas=o.betas, eps=o.eps,
                                           weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.total_steps, o.warmup_fraction, o.min_lr_ratio))
        self.step = 0
        self.tokens_seen = 0
        self.run_dir = Path(t.output_dir)
        self.log = MetricsLog(self.run_dir / "metrics.jsonl")

    def sequences_in_order(self) -> list:
        """The distinct training sequences the run's `total_steps` steps read, in the order they do."""
        seen: dict[int, None] = {}
        for step in range(self.total_steps):
            for micro in self.order.shard(step, 0, 1, 1):
                for example in micro:
                    seen.setdefault(example.index, None)
            if len(seen) == len(self.train_sequences):
                break
        return [self.train_sequences[i] for i in seen]

    # ------------------------------------------------------------------ pieces
    def _autocast(self):
        return torch.autocast(self.dist.device.type, dtype=self.autocast_dtype or torch.float32,
                              enabled=self.autocast_dtype is not None)

    def _batch(self, examples, num_anchors: int | None = None):
        c = self.draft.config
        return build_batch(examples, block_size=c.block_size, num_anchors=num_anchors or self.cfg.loss.num_anchors,
                           mask_token_id=c.mask_token_id, window=c.sliding_window, seed=self.cfg.train.seed)

    def step_batches(self) -> list:
        """This rank's micro-batches of the next step (with replay: then one of replay rows, taken from the buffer)."""
        micro = self.order.shard(self.step, self.dist.rank, self.dist.world, self.cfg.train.grad_accum)
        if self.replay is None:
            return [self._batch(examples) for examples in micro]
        loss = self.cfg.loss
        fresh = fresh_anchors(loss.num_anchors, loss.replay_fraction)
        return [self._batch(examples, fresh) for examples in self.replay.extend(micro, self.train_sequences)]

    def _zero_stats(self) -> LossStats:
        return LossStats.zeros(self.draft.config.block_size - 1, self.dist.device)

    def train_step(self) -> tuple[LossStats, dict[str, float]]:
        """One optimiser step; returns (this rank's stat sums, {"grad_norm": backbone norm before
        clipping[, "grad_norm_selector": ...]})."""
        world = self.dist.world
        batches = self.step_batches()
        weighting = self.cfg.loss.position_weighting
        totals = torch.tensor([sum(step_share(b, self.module.weights, weighting) for b in batches),
                               sum(b.num_fresh_tokens for b in batches)], dtype=torch.float64, device=self.dist.device)
        self.dist.all_reduce_sum(totals)
        normaliser = max(float(totals[0]), 1e-6)
        self.tokens_seen += int(totals[1])
        self.optimizer.zero_grad(set_to_none=True)
        stats = self._zero_stats()
        for i, batch in enumerate(batches):
            batch = batch.to(self.dist.device)
            with self._autocast():
                signals = self.features(batch)
            teacher = _teacher(signals, batch)
            with Dist.no_sync(self.wrapped, i == len(batches) - 1):
                with self._autocast():
                    loss, step_stats, outcome = self.wrapped(signals.features, batch, normaliser, teacher)
                (loss * world).backward()
            if self.replay is not None:
                self.replay.observe(batch, outcome, self.step)
            stats = stats + step_stats
        clip = self.cfg.optim.grad_clip or float("inf")
        norms = {}
        for name, group in self.clip_groups.items():
            norm = torch.nn.utils.clip_grad_norm_(group, clip)
            norms[name] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return stats, norms

    def _summary(self, stats: LossStats) -> dict:
        """Metrics of `stats` summed over all ranks."""
        return stats.reduced(self.dist).summary(self.cfg.loss.selector_weight, self.draft.config.use_selector)

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        """Teacher-forced metrics on the eval sequences (fixed anchors), all ranks together."""
        if not self.eval_sequences:
            return None
        world, rank = self.dist.world, self.dist.rank
        usable = len(self.eval_sequences) // world * world
        mine = list(range(rank, usable, world))
        size = max(1, self.cfg.train.batch_size // (world * self.cfg.train.grad_accum))
        stats = self._zero_stats()
        for start in range(0, len(mine), size):
            examples = [Example(*self.eval_sequences[i], key=(-1, i), index=-1 - i) for i in mine[start:start + size]]
            batch = self._batch(examples).to(self.dist.device)
            with self._autocast():
                features = self.adapter.features(batch.input_ids, batch.attention_mask)[1]
                _, batch_stats, _ = self.module(features, batch, 1.0)
            stats = stats + batch_stats
        return self._summary(stats) if mine else None

    # ------------------------------------------------------------------ checkpoints
    def _trainer_state(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), "tokens_seen": self.tokens_seen,
                "samples_seen": self.step * self.cfg.train.batch_size, "rng": ckpt.rng_state(),
                "config": self.cfg.to_dict(), "world_size": self.dist.world,
                **({"replay": self.replay.state_dict()} if self.replay is not None else {})}

    def save(self) -> None:
        draft_state, optim_state = ckpt.gather_state(self.wrapped, self.optimizer, self.cfg.train.parallel)
        if self.dist.is_main:
            ckpt.save_checkpoint(self.run_dir, self.step, draft_state, optim_state, self._trainer_state(),
                                 self.draft.config, self.cfg.train.keep_checkpoints)
            plot_curves(self.log.path, self.run_dir / "curves.png")
        self.dist.barrier()

    def resume(self) -> Path:
        path, draft_state, state = ckpt.load_latest(self.run_dir)
        _check_same_config(state["config"], self.cfg.to_dict())
        ckpt.restore_state(self.wrapped, self.optimizer, draft_state, state["optimizer"], self.cfg.train.parallel)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        ckpt.set_rng_state(state["rng"])
        if self.replay is not None:
            require("replay" in state, f"--resume: checkpoint '{path}' has no replay buffer")
            self.replay.load_state_dict(state["replay"])
        if self.dist.is_main:
            self.log.truncate_after(self.step)
        self.dist.barrier()
        return path

    def export(self) -> dict:
        draft_state, _ = ckpt.gather_state(self.wrapped, self.optimizer, self.cfg.train.parallel)
        out = {}
        if self.dist.is_main:
            dtype = torch.bfloat16 if self.cfg.train.save_dtype == "bf16" else torch.float32
            size = ckpt.export_draft(draft_state, self.draft.config, self.run_dir / "final", dtype)
            out = {"final_dir": str(self.run_dir / "final"), "final_bytes": size}
        self.dist.barrier()
        return out

    # ------------------------------------------------------------------ loop
    def train(self, resume: bool = False, stop_at: int | None = None) -> dict:
        """Train to the end (or only up to step `stop_at`, checkpointing there: an interruption)."""
        t = self.cfg.train
        end = min(self.total_steps, stop_at or self.total_steps)
        if resume:
            self.resume()
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.run_dir / "train_config.yaml", "w") as handle:
                yaml.safe_dump(self.cfg.to_dict(), handle, sort_keys=False)
        bar = _progress(self.total_steps, self.step, self.dist.is_main and t.progress)
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        interval, interval_tokens, clock = self._zero_stats(), self.tokens_seen, time.perf_counter()
        last = {}
        while self.step < end:
            began = time.perf_counter()
            stats, grad_norms = self.train_step()
            interval = interval + stats
            bar.update(1)
            if t.max_cpu_seconds and time.process_time() - cpu_start >= t.max_cpu_seconds:
                self.total_steps = end = self.step  # the CPU budget is spent: this step is the last
            now = time.perf_counter()
            if t.max_wall_seconds and (now - wall_start) + (now - began) >= t.max_wall_seconds:
                self.total_steps = end = self.step  # one more step would end past the wall-clock budget
            final = self.step == self.total_steps
            if self.step % t.log_every == 0 or final:
                now = time.perf_counter()
                last = {"split": "train", "step": self.step, "epoch": round(self.step / self.order.steps_per_epoch, 4),
                        "tokens": self.tokens_seen, "lr": self.scheduler.get_last_lr()[0], **grad_norms,
                        "tokens_per_s": (self.tokens_seen - interval_tokens) / max(now - clock, 1e-9),
                        **self._summary(interval), **(self.replay.interval_metrics() if self.replay is not None else {})}
                interval, interval_tokens, clock = self._zero_stats(), self.tokens_seen, now
                bar.set_postfix(loss=f"{last['loss']:.3f}", tau=f"{last['tau']:.2f}",
                                tok_s=f"{last['tokens_per_s']:.0f}")
                self._log(last)
            if (t.eval_every and self.step % t.eval_every == 0) or (final and self.eval_sequences):
                metrics = self.evaluate()
                if metrics is not None:
                    self._log({"split": "eval", "step": self.step, "tokens": self.tokens_seen, **metrics})
            if (t.checkpoint_every and self.step % t.checkpoint_every == 0) or self.step == end:
                self.save()
        bar.close()
        summary = {"steps": self.step, "tokens": self.tokens_seen, "parameters": self.draft.num_parameters(),
                   "cpu_seconds": time.process_time() - cpu_start, "wall_seconds": time.perf_counter() - wall_start,
                   "data": self.data_counts,
                   "build": {k: v for k, v in self.build_report.items() if k != "warm_started"}, "last": last}
        if self.step < self.total_steps:
            return summary
        summary.update(self.export())
        if self.dist.is_main:
            with atomic_write(self.run_dir / "summary.json", "w") as handle:
                json.dump(summary, handle, indent=2)
        return summary

    def _log(self, record: dict) -> None:
        if self.dist.is_main:
            self.log.append(record)

    def close(self) -> None:
        self.adapter.close()
        self.dist.close()


def _teacher(signals: TargetSignals, batch) -> Teacher | None:
    """The target's top-k prediction of each label: made at position anchor + j - 1 for the token at
    anchor + j, i.e. at block positions 0..B-2 -> ids / logits [b, N, B-1, k]."""
    if signals.top_ids is None:
        return None
    b, n, block = batch.block_positions.shape
    where = batch.block_positions[:, :, :-1].reshape(b, -1, 1)                    # [b, N*(B-1), 1]
    k = signals.top_ids.shape[-1]

    def pick(table: torch.Tensor) -> torch.Tensor:
        return table.gather(1, where.expand(-1, -1, k)).view(b, n, block - 1, k)

    return Teacher(pick(signals.top_ids), pick(signals.top_logits))


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kwargs) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, initial: int, show: bool):
    """A tqdm bar with ETA, or a stand-in (even a disabled tqdm starts a monitor thread that
    delays interpreter exit)."""
    if not show:
        return _NoBar()
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def config_difference(saved: dict, current: dict, free: set[str] = RESUMABLE_CHANGES) -> tuple[str, Any, Any] | None:
    """The first config key outside `free` whose value differs (both in `TrainConfig.to_dict()` form):
    (dotted key, current value, saved value), or None."""
    for section, keys in current.items():
        for key, value in keys.items():
            dotted = f"{section}.{key}"
            trained_with = saved.get(section, {}).get(key, LEGACY_VALUES.get(dotted))
            if dotted not in free and trained_with != value:
                return dotted, value, trained_with
    return None


def _check_same_config(saved: dict, current: dict) -> None:
    difference = config_difference(saved, current)
    if difference is not None:
        dotted, value, trained_with = difference
        raise DFlash2Error(f"--resume: config key '{dotted}' is {value!r} but the checkpoint was trained "
                           f"with {trained_with!r}")


@dataclass(frozen=True)
class TrainCommand:
    """`dflash2 train CONFIG [section.key=value ...] [--resume | --overwrite]`, options and overrides in any order."""

    config: str
    overrides: tuple[str, ...]
    resume: bool
    features_only: bool = False
    overwrite: bool = False


def parse_command(argv: list[str] | None = None) -> TrainCommand:
    parser = OneLineParser(prog="dflash2 train", description="Train a DFlash2 / DFlash draft for a target.")
    parser.add_argument("config", help="YAML training config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=100 draft.use_selector=false")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in train.output_dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="start again in an existing train.output_dir: removes the earlier run's own files "
                             f"({', '.join(RUN_FILES)}) and nothing else")
    parser.add_argument("--features-only", action="store_true",
                        help="only fill data.feature_cache_dir with the target's features and top-k logits "
                             "(loss.distill_top_k) of the sequences the run's steps will read, then exit")
    # intermixed: `CONFIG --resume train.steps=540` too (plain parse_args stops the overrides at --resume)
    args = parser.parse_intermixed_args(argv)
    return TrainCommand(args.config, tuple(args.overrides), args.resume, args.features_only, args.overwrite)


def main(argv: list[str] | None = None) -> int:
    command = parse_command(argv)
    cfg = load_config(command.config, list(command.overrides))
    for directory in check_inputs(cfg):  # before the target loads
        print(f"note: data.train '{directory}' is off-policy (its answers are a file's, not the target's): "
              "expect a lower tau than from the target's own answers to the same prompts (TRAINING.md §2)",
              file=sys.stderr)
    require_one_process(cfg.loss.replay_fraction, int(os.environ.get("WORLD_SIZE", "1")))
    if not command.features_only:
        prepare_run_dir(cfg, command.resume, command.overwrite, main_rank=int(os.environ.get("RANK", "0")) == 0)
    trainer = Trainer(cfg)
    try:
        if command.features_only:
            source = FeatureSource(trainer.adapter, cfg.data.feature_cache_dir, trainer.features.root.name,
                                   top_k=cfg.loss.distill_top_k)
            computed = source.fill(trainer.sequences_in_order(), progress=cfg.train.progress)
            print(json.dumps({"features_computed": computed, "sequences": len(trainer.train_sequences),
                              "cache": str(source.root)}))
            return 0
        summary = trainer.train(resume=command.resume)
    finally:
        trainer.close()
    if trainer.dist.is_main:
        print(json.dumps({k: v for k, v in summary.items() if k != "last"}))
    return 0
