"""Training configuration: the YAML schema of `dflash2 train CONFIG.yaml section.key=value ...`.

Contract:
- A `TrainConfig` has six sections, each a frozen dataclass with typed fields and defaults:
  `target`, `data`, `draft`, `loss`, `optim`, `train` (`cfg.train.batch_size`). The `draft`
  section is a `model.shape.DraftShape` (whose defaults are the published draft shape) plus how the
  draft starts (mask token, final-norm init, warm start, `init_from`); `configs/*.yaml` are
  complete files. Only `data.train` is needed to train on real data. `draft.family: mtp` trains an
  MTP head instead (`training.mtp_step`): of the shape keys only `block_size` applies (the head is
  one target-shaped layer); `warm_start_from_target` starts it from the target's own head where
  the target ships one, and `init_from` from an MTP head checkpoint.
- A section checks itself when constructed (from a mapping or by `dataclasses.replace`): a wrong
  type or an out-of-range value raises a one-line `DFlash2Error` naming the dotted key (e.g.
  "train.batch_size"); lists are stored as tuples. `TrainConfig` adds the checks that involve two
  keys. `TrainConfig.from_dict(d)` also refuses unknown sections and keys, and reads the dict form
  that `to_dict()` writes (the run's `train_config.yaml`, the copy inside every checkpoint),
  including those of older versions, which may lack keys added since (they take the defaults).
- `load_config(path, overrides)` reads the YAML, applies dotted `section.key=value` overrides (`target=NAME`
  is `target.name=NAME`, like the file's `target: NAME`)
  (values parsed as YAML, so `train.steps=100`, `draft.use_selector=false`, `optim.betas=[0.9,0.99]`)
  and returns the validated config. Numbers read the way people write them, in files and overrides
  alike: `1e-3`, `1E-3`, `6e-4`, `-1e-2`, `.5`, `1_000` (plain YAML 1.1 reads the first four as strings).
- `gamma` (loss position decay) defaults to 4 for block size 8, 7 for block size 16 and
  block_size / 2 otherwise; `resolved_gamma()` gives the value in use.
"""
from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar

import yaml

from dflash2.errors import DFlash2Error, require
from dflash2.model.shape import DraftShape
from dflash2.training.replay import replay_anchors
from dflash2.training.weighting import WEIGHTINGS


@dataclass(frozen=True)
class Rule:
    """A range check of one key and what it means, for the error message."""

    test: Callable[[Any], bool]
    meaning: str


_AT_LEAST_1 = Rule(lambda v: v >= 1, "a positive integer")
_POSITIVE = Rule(lambda v: v > 0, "a positive number")
_NON_NEGATIVE = Rule(lambda v: v >= 0, "a number >= 0")


def _one_of(*choices: str) -> Rule:
    return Rule(lambda v: v in choices, " or ".join(repr(c) for c in choices))


class _Section:
    """Base of the config sections: on construction every field is type-checked against its
    annotation (ints stay ints, ints become floats where a float is typed, lists become tuples)
    and against the section's `RULES`; errors name `NAME.field`."""

    NAME: ClassVar[str] = ""
    RULES: ClassVar[dict[str, Rule]] = {}

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):  # type: ignore[arg-type]
            key = f"{self.NAME}.{f.name}"
            value = _coerce(key, hints[f.name], getattr(self, f.name))
            rule = self.RULES.get(f.name)
            if value is not None and rule is not None:
                require(rule.test(value), f"config key '{key}' must be {rule.meaning}, got {_plain(value)!r}")
            object.__setattr__(self, f.name, value)


def _coerce(key: str, hint: Any, value: Any) -> Any:
    """`value` checked against the type `hint` (a DFlash2Error naming `key` if it does not fit)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # `X | None`
        (inner,) = [a for a in args if a is not type(None)]
        return None if value is None else _coerce(key, inner, value)
    if origin is tuple:
        variable = args[-1] is Ellipsis
        if value is None and variable:
            return ()
        if args[0] is str and isinstance(value, str):  # `data.train: some/dir` is a list of one
            value = [value]
        require(isinstance(value, (list, tuple)), f"config key '{key}' must be a list, got {value!r}")
        require(variable or len(value) == len(args),
                f"config key '{key}' must be a list of {len(args)} items, got {_plain(value)!r}")
        return tuple(_coerce(f"{key}[{i}]", args[0], item) for i, item in enumerate(value))
    require(value is not None, f"config key '{key}' must not be null")
    if hint is bool:
        require(isinstance(value, bool), f"config key '{key}' must be true or false, got {value!r}")
    elif hint is int:
        require(isinstance(value, int) and not isinstance(value, bool),
                f"config key '{key}' must be an integer, got {value!r}")
    elif hint is float:
        require(isinstance(value, (int, float)) and not isinstance(value, bool),
                f"config key '{key}' must be a number, got {value!r}")
        value = float(value)
    elif hint is str:
        require(isinstance(value, str) and value != "", f"config key '{key}' must be a non-empty string, got {value!r}")
    return value


def _plain(value: Any) -> Any:
    """Tuples back to lists (the YAML / checkpoint form)."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


# ---------------------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class TargetSection(_Section):
    NAME = "target"
    name: str = "smollm2"                       # built-in name, local directory or hub id


@dataclass(frozen=True)
class DataSection(_Section):
    NAME = "data"
    RULES = {"max_seq_len": Rule(lambda v: v >= 2, "an integer >= 2"), "max_eval_sequences": _AT_LEAST_1}
    train: tuple[str, ...] = ()                 # shard directories
    eval: tuple[str, ...] = ()                  # held-out shard directories (optional)
    max_seq_len: int = 3072
    max_eval_sequences: int = 256
    feature_cache_dir: str | None = None        # optional on-disk target-feature cache
    exclude_holdout: bool = False               # leave out the held-out records (data/holdout.py), kept for the yardstick


@dataclass(frozen=True)
class DraftSection(_Section, DraftShape):
    """The draft's shape (`DraftShape`: its defaults) and how a fresh draft starts."""

    NAME = "draft"
    RULES = {
        "num_layers": _AT_LEAST_1, "intermediate_size": _AT_LEAST_1, "num_attention_heads": _AT_LEAST_1,
        "num_key_value_heads": _AT_LEAST_1, "head_dim": _AT_LEAST_1, "num_taps": _AT_LEAST_1,
        "block_size": Rule(lambda v: v >= 2, "an integer >= 2"), "sliding_window": _AT_LEAST_1,
        "selector_rank": _AT_LEAST_1, "selector_top_k": _AT_LEAST_1, "conv_group_size": _AT_LEAST_1,
        "mask_token_id": Rule(lambda v: v >= 0, "a token id >= 0"), "final_norm_init": _POSITIVE,
        "draft_vocab_size": Rule(lambda v: v >= 2, "an integer >= 2 (or null: the target's vocabulary)"),
        "family": _one_of("dflash2", "mtp"),
    }
    family: str = "dflash2"                     # dflash2: a DFlash / DFlash2 block draft; mtp: an MTP head
    mask_token_id: int | None = None            # None: targets.chat.choose_mask_token
    final_norm_init: float = 0.1                # fresh drafts start near-uniform (model/factory.py)
    warm_start_from_target: bool = False
    init_from: str | None = None                # start from an existing draft checkpoint

    def shape(self) -> DraftShape:
        return DraftShape(**{f.name: getattr(self, f.name) for f in fields(DraftShape)})


@dataclass(frozen=True)
class LossSection(_Section):
    NAME = "loss"
    RULES = {"num_anchors": _AT_LEAST_1, "gamma": _POSITIVE, "selector_weight": _NON_NEGATIVE,
             "logits_chunk": _AT_LEAST_1, "distill_weight": Rule(lambda v: 0 <= v <= 1, "a number in [0, 1]"),
             "distill_top_k": Rule(lambda v: v >= 0, "an integer >= 0 (0: keep none)"),
             "acceptance_weight": Rule(lambda v: 0 <= v <= 1, "a number in [0, 1]"), "position_weighting": _one_of(*WEIGHTINGS),
             "dpace_alpha": Rule(lambda v: 0 < v <= 1, "a number in (0, 1]"),
             "selector_weighting": _one_of("decay", "backbone"),
             "replay_fraction": Rule(lambda v: 0 <= v < 1, "a number in [0, 1) (0: no replay)"),
             "replay_capacity": _AT_LEAST_1,
             "replay_max_accepted": Rule(lambda v: v >= 0, "an integer >= 0"),
             "replay_max_times": _AT_LEAST_1}
    num_anchors: int = 64                       # blocks per sequence
    gamma: float | None = None                  # position decay; None: see resolved_gamma
    selector_weight: float = 1.0
    selector_grad_to_backbone: bool = False
    logits_chunk: int = 256                     # positions per [chunk, vocab] logits slice
    distill_weight: float = 0.0                 # share of the target's own distribution in the token loss
    distill_top_k: int = 32                     # target logits kept per position (distillation, acceptance loss)
    position_weighting: str = "decay"           # token-loss weights: fixed decay or "dpace" (training/weighting.py)
    dpace_alpha: float = 0.5                    # D-PACE confidence smoothing (1: weight = positions left)
    selector_weighting: str = "decay"           # selector-loss weights: fixed decay or "backbone" (the token loss's)
    selector_gold: bool = False                 # a true token missing from the top K replaces the K-th in the selector loss
    acceptance_weight: float = 0.0              # share of -log(acceptance rate) (the LK loss, training/acceptance.py) in the token loss
    replay_fraction: float = 0.0                # share of each step's anchors re-training rejected blocks (training/replay.py); 0: off
    replay_capacity: int = 2048                 # rejected blocks the replay buffer keeps
    replay_max_accepted: int = 1                # a block is rejected when its acceptance path gets at most this many tokens right
    replay_max_times: int = 1                   # replays of one block before it leaves the buffer


@dataclass(frozen=True)
class OptimSection(_Section):
    NAME = "optim"
    RULES = {
        "lr": _POSITIVE, "betas": Rule(lambda v: all(0 <= b < 1 for b in v), "two numbers in [0, 1)"),
        "eps": _POSITIVE, "weight_decay": _NON_NEGATIVE,
        "warmup_fraction": Rule(lambda v: 0 <= v < 1, "a number in [0, 1)"),
        "min_lr_ratio": Rule(lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        "grad_clip": Rule(lambda v: v > 0, "a positive number (or null for no clipping)"),
    }
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_fraction: float = 0.04
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    clip_selector_separately: bool = True       # the selector gets its own clip norm (training/draft_step.py)


@dataclass(frozen=True)
class TrainSection(_Section):
    NAME = "train"
    RULES = {
        "steps": Rule(lambda v: v >= 1, "a positive integer (or null: epochs decide)"), "epochs": _POSITIVE,
        "batch_size": Rule(lambda v: v >= 1, "a positive integer (sequences per optimiser step, all ranks)"),
        "grad_accum": _AT_LEAST_1, "precision": _one_of("fp32", "bf16", "auto"),
        "device": _one_of("auto", "cpu", "cuda"), "parallel": _one_of("ddp", "fsdp"), "log_every": _AT_LEAST_1,
        "eval_every": Rule(lambda v: v >= 1, "a positive integer (or null)"),
        "checkpoint_every": Rule(lambda v: v >= 1, "a positive integer (or null)"),
        "keep_checkpoints": _AT_LEAST_1, "save_dtype": _one_of("fp32", "bf16"),
        "max_cpu_seconds": Rule(lambda v: v > 0, "a positive number of seconds (or null)"),
        "max_wall_seconds": Rule(lambda v: v > 0, "a positive number of seconds (or null)"),
    }
    steps: int | None = None                    # None: epochs x (sequences / batch_size)
    epochs: float = 1.0
    batch_size: int = 8                         # sequences per optimiser step, all ranks together
    grad_accum: int = 1
    seed: int = 0
    precision: str = "fp32"
    device: str = "auto"
    parallel: str = "ddp"
    output_dir: str = "runs/dflash2"
    log_every: int = 10
    eval_every: int | None = None
    checkpoint_every: int | None = 500
    keep_checkpoints: int = 2
    save_dtype: str = "bf16"
    progress: bool = True
    max_cpu_seconds: float | None = None        # stop (checkpoint, export) once this process used this much CPU
    max_wall_seconds: float | None = None       # stop (checkpoint, export) before another step would end past this wall-clock time


# ---------------------------------------------------------------------------------------- the config
@dataclass(frozen=True)
class TrainConfig:
    """Validated training configuration: `cfg.section.key`, e.g. `cfg.train.batch_size`."""

    target: TargetSection = field(default_factory=TargetSection)
    data: DataSection = field(default_factory=DataSection)
    draft: DraftSection = field(default_factory=DraftSection)
    loss: LossSection = field(default_factory=LossSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)

    def __post_init__(self) -> None:
        d, t = self.draft, self.train
        require(t.batch_size % t.grad_accum == 0,
                f"config key 'train.grad_accum'={t.grad_accum} must divide train.batch_size={t.batch_size}")
        require(self.data.max_seq_len > d.block_size,
                f"config key 'data.max_seq_len'={self.data.max_seq_len} must exceed draft.block_size={d.block_size}")
        for key in ("distill_weight", "acceptance_weight"):   # both read the target's top-k distribution
            value = getattr(self.loss, key)
            require(value == 0 or self.loss.distill_top_k > 0,
                    f"config key 'loss.{key}'={value} needs loss.distill_top_k > 0 (the target's top-k it reads), got 0")
        if self.loss.replay_fraction > 0:
            replayed = replay_anchors(self.loss.num_anchors, self.loss.replay_fraction)
            require(1 <= replayed < self.loss.num_anchors,
                    f"config key 'loss.replay_fraction'={self.loss.replay_fraction} must leave at least one of "
                    f"loss.num_anchors={self.loss.num_anchors} anchors each to replay and to fresh blocks")
            require(self.loss.replay_max_accepted < d.block_size - 1,
                    f"config key 'loss.replay_max_accepted'={self.loss.replay_max_accepted} must be below the "
                    f"{d.block_size - 1} tokens a block drafts (draft.block_size={d.block_size})")
        if d.family == "mtp":   # the head reads the target's last layer, with the target's vocabulary
            require(d.draft_vocab_size is None and d.target_layer_ids is None,
                    "config keys 'draft.draft_vocab_size' and 'draft.target_layer_ids' must be null for "
                    "draft.family=mtp (an MTP head reads the target's last layer and scores its whole vocabulary)")
        if d.target_layer_ids is not None:
            require(len(d.target_layer_ids) > 0, "config key 'draft.target_layer_ids' must not be empty")
            require(len(set(d.target_layer_ids)) == len(d.target_layer_ids),
                    "config key 'draft.target_layer_ids' has repeated layers")

    @classmethod
    def from_dict(cls, raw: dict | None) -> "TrainConfig":
        raw = raw or {}
        require(isinstance(raw, dict), "training config must be a YAML mapping of sections")
        for name in raw:
            require(name in SECTIONS, f"unknown config section '{name}' (expected one of {', '.join(SECTIONS)})")
        sections = {}
        for name, section in SECTIONS.items():
            given = raw.get(name) or {}
            if name == "target" and isinstance(given, str):  # `target: smollm2` shorthand
                given = {"name": given}
            require(isinstance(given, dict), f"config section '{name}' must be a mapping")
            for key in given:
                require(key in section_keys(name), f"unknown config key '{name}.{key}'")
            sections[name] = section(**given)
        return cls(**sections)

    def to_dict(self) -> dict:
        """{section: {key: value}} with lists, as written to `train_config.yaml` and checkpoints."""
        return {name: {f.name: _plain(getattr(getattr(self, name), f.name)) for f in fields(getattr(self, name))}
                for name in SECTIONS}

    def resolved_gamma(self) -> float:
        if self.loss.gamma is not None:
            return self.loss.gamma
        block = self.draft.block_size
        return {8: 4.0, 16: 7.0}.get(block, block / 2)


SECTIONS: dict[str, type] = {f.name: typing.get_type_hints(TrainConfig)[f.name] for f in fields(TrainConfig)}


def section_keys(name: str) -> tuple[str, ...]:
    """The keys of config section `name`."""
    return tuple(f.name for f in fields(SECTIONS[name]))


# ---------------------------------------------------------------------------------------- reading
class _ConfigLoader(yaml.SafeLoader):
    """YAML 1.1 safe loading with YAML 1.2 floats: `1e-3`, `6E-4`, `-1e-2` are numbers (YAML 1.1
    wants a dot and a signed exponent, `1.0e-3`, and reads the others as strings)."""


_FLOAT_TAG = "tag:yaml.org,2002:float"
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver(_FLOAT_TAG, re.compile(r"""^(?:
    [-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?     # 1.5, 1., 1.0e-3
  | [-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?           # .5, -.5e1
  | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+                 # 1e-3, 6E-4, 1e3
  | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN))$""", re.X), list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """YAML text -> Python values, numbers as people write them (see `_ConfigLoader`)."""
    return yaml.load(text, Loader=_ConfigLoader)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply dotted `section.key=value` overrides (value parsed as YAML: a scalar or a list)."""
    raw = dict(raw or {})
    for item in overrides:
        require("=" in item, f"override '{item}' must look like section.key=value")
        dotted, text = item.split("=", 1)
        parts = dotted.strip().split(".")
        if parts == ["target"]:  # `target=NAME`, like the file's `target: NAME` shorthand
            parts = ["target", "name"]
        require(len(parts) == 2 and all(parts),
                f"override key '{dotted}' must be section.key (e.g. train.steps=100)")
        section, key = parts
        require(section in SECTIONS, f"unknown config section '{section}' in override '{item}'")
        require(key in section_keys(section), f"unknown config key '{dotted}' in override '{item}'")
        try:
            value = parse_yaml(text) if text.strip() else None
        except yaml.YAMLError:
            raise DFlash2Error(f"override '{item}': value is not valid YAML") from None
        current = raw.get(section) or {}
        if section == "target" and isinstance(current, str):
            current = {"name": current}
        require(isinstance(current, dict), f"config section '{section}' must be a mapping")
        raw[section] = {**current, key: value}
    return raw


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML config (or start from defaults when `path` is None) and apply overrides."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        require(path.exists(), f"training config '{path}' does not exist")
        require(path.is_file(), f"training config '{path}' is not a file")
        try:
            raw = parse_yaml(path.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as err:
            raise DFlash2Error(f"training config '{path}' is not UTF-8 text (byte {err.start})") from None
        except yaml.YAMLError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else "parse error"
            raise DFlash2Error(f"training config '{path}' is not valid YAML: {first}") from None
        require(isinstance(raw, dict), f"training config '{path}' must be a YAML mapping of sections")
    return TrainConfig.from_dict(apply_overrides(raw, list(overrides)))
