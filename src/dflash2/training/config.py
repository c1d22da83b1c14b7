"""Training configuration: the YAML schema of `dflash2 train CONFIG.yaml key=value ...`.

Contract:
- A config is one YAML mapping with the sections below (see `configs/*.yaml` for complete files).
  Every key has a default; only `data.train` is needed to train on real data.
- `load_config(path, overrides)` reads the YAML, applies dotted `key=value` overrides (values are
  parsed as YAML scalars, so `train.steps=100`, `draft.use_selector=false`, `optim.betas=[0.9,0.99]`)
  and returns a validated `TrainConfig`.
- `TrainConfig.from_dict(d)` validates: an unknown section or key, a wrong type or a value out of
  range raises a one-line `DFlash2Error` naming the dotted key (e.g. "train.batch_size").
- `to_dict()` gives the plain mapping back (written into the run directory as `train_config.yaml`).
- `gamma` (loss position decay) defaults to 4 for block size 8, 7 for block size 16 and
  block_size / 2 otherwise; `resolved_gamma()` gives the value in use.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from dflash2.errors import DFlash2Error, require

_INT, _FLOAT, _BOOL, _STR = "int", "float", "bool", "str"

# section -> key -> (kind, default, check, what the check means). kind may end in "?" (None allowed)
# or be "list[int]" / "list[str]" / "list[float]" (None allowed for all lists).
SCHEMA: dict[str, dict[str, tuple]] = {
    "target": {
        "name": (_STR, "smollm2", None, None),          # built-in name, local directory or hub id
    },
    "data": {
        "train": ("list[str]", [], None, None),         # shard directories
        "eval": ("list[str]", [], None, None),          # held-out shard directories (optional)
        "max_seq_len": (_INT, 3072, lambda v: v >= 2, "an integer >= 2"),
        "max_eval_sequences": (_INT, 256, lambda v: v >= 1, "an integer >= 1"),
        "feature_cache_dir": (_STR + "?", None, None, None),  # optional on-disk target-feature cache
    },
    "draft": {
        "num_layers": (_INT, 3, lambda v: v >= 1, "an integer >= 1"),
        "intermediate_size": (_INT + "?", None, lambda v: v >= 1, "a positive integer"),  # None: target's
        "num_attention_heads": (_INT + "?", None, lambda v: v >= 1, "a positive integer"),
        "num_key_value_heads": (_INT + "?", None, lambda v: v >= 1, "a positive integer"),
        "head_dim": (_INT + "?", None, lambda v: v >= 1, "a positive integer"),
        "num_taps": (_INT + "?", None, lambda v: v >= 1, "a positive integer"),
        "target_layer_ids": ("list[int]", None, None, None),
        "block_size": (_INT, 8, lambda v: v >= 2, "an integer >= 2"),
        "mask_token_id": (_INT + "?", None, lambda v: v >= 0, "a token id >= 0"),  # None: auto
        "sliding_window": (_INT, 2048, lambda v: v >= 1, "a positive integer"),
        "use_conv": (_BOOL, True, None, None),
        "use_selector": (_BOOL, True, None, None),
        "selector_rank": (_INT, 64, lambda v: v >= 1, "a positive integer"),
        "selector_top_k": (_INT, 16, lambda v: v >= 1, "a positive integer"),
        "conv_group_size": (_INT, 16, lambda v: v >= 1, "a positive integer"),
        "final_norm_init": (_FLOAT, 0.1, lambda v: v > 0, "a positive number"),  # fresh drafts start near-uniform
        "warm_start_from_target": (_BOOL, False, None, None),
        "init_from": (_STR + "?", None, None, None),    # start from an existing draft checkpoint
    },
    "loss": {
        "num_anchors": (_INT, 64, lambda v: v >= 1, "an integer >= 1"),
        "gamma": (_FLOAT + "?", None, lambda v: v > 0, "a positive number"),
        "selector_weight": (_FLOAT, 1.0, lambda v: v >= 0, "a number >= 0"),
        "selector_grad_to_backbone": (_BOOL, False, None, None),
        "logits_chunk": (_INT, 256, lambda v: v >= 1, "a positive integer"),
    },
    "optim": {
        "lr": (_FLOAT, 6e-4, lambda v: v > 0, "a positive number"),
        "betas": ("list[float]", [0.9, 0.95], lambda v: len(v) == 2 and all(0 <= b < 1 for b in v),
                  "two numbers in [0, 1)"),
        "eps": (_FLOAT, 1e-8, lambda v: v > 0, "a positive number"),
        "weight_decay": (_FLOAT, 0.0, lambda v: v >= 0, "a number >= 0"),
        "warmup_fraction": (_FLOAT, 0.04, lambda v: 0 <= v < 1, "a number in [0, 1)"),
        "min_lr_ratio": (_FLOAT, 0.1, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        "grad_clip": (_FLOAT + "?", 1.0, lambda v: v > 0, "a positive number (or null for no clipping)"),
        "clip_selector_separately": (_BOOL, True, None, None),
    },
    "train": {
        "steps": (_INT + "?", None, lambda v: v >= 1, "a positive integer (or null: epochs decide)"),
        "epochs": (_FLOAT, 1.0, lambda v: v > 0, "a positive number"),
        "batch_size": (_INT, 8, lambda v: v >= 1, "a positive integer (sequences per optimiser step, all ranks)"),
        "grad_accum": (_INT, 1, lambda v: v >= 1, "a positive integer"),
        "seed": (_INT, 0, None, None),
        "precision": (_STR, "fp32", lambda v: v in ("fp32", "bf16", "auto"), "'fp32', 'bf16' or 'auto'"),
        "device": (_STR, "auto", lambda v: v in ("auto", "cpu", "cuda"), "'auto', 'cpu' or 'cuda'"),
        "parallel": (_STR, "ddp", lambda v: v in ("ddp", "fsdp"), "'ddp' or 'fsdp'"),
        "output_dir": (_STR, "runs/dflash2", None, None),
        "log_every": (_INT, 10, lambda v: v >= 1, "a positive integer"),
        "eval_every": (_INT + "?", None, lambda v: v >= 1, "a positive integer (or null)"),
        "checkpoint_every": (_INT + "?", 500, lambda v: v >= 1, "a positive integer (or null)"),
        "keep_checkpoints": (_INT, 2, lambda v: v >= 1, "a positive integer"),
        "save_dtype": (_STR, "bf16", lambda v: v in ("fp32", "bf16"), "'fp32' or 'bf16'"),
        "progress": (_BOOL, True, None, None),
    },
}


def _check_kind(key: str, kind: str, value: Any) -> Any:
    """Coerce / check one value against its kind; raise DFlash2Error naming `key`."""
    optional = kind.endswith("?") or kind.startswith("list")
    base = kind.rstrip("?")
    if value is None:
        require(optional, f"config key '{key}' must not be null")
        return None
    if base.startswith("list["):
        item = base[5:-1]
        if item == "str" and isinstance(value, str):
            value = [value]
        require(isinstance(value, (list, tuple)), f"config key '{key}' must be a list, got {value!r}")
        return [_check_kind(f"{key}[{i}]", item, v) for i, v in enumerate(value)]
    if base == _BOOL:
        require(isinstance(value, bool), f"config key '{key}' must be true or false, got {value!r}")
    elif base == _INT:
        require(isinstance(value, int) and not isinstance(value, bool), f"config key '{key}' must be an integer, got {value!r}")
    elif base == _FLOAT:
        require(isinstance(value, (int, float)) and not isinstance(value, bool), f"config key '{key}' must be a number, got {value!r}")
        value = float(value)
    elif base == _STR:
        require(isinstance(value, str) and value != "", f"config key '{key}' must be a non-empty string, got {value!r}")
    return value


@dataclasses.dataclass
class TrainConfig:
    """Validated training configuration: `cfg.section["key"]`, e.g. `cfg.train["batch_size"]`."""

    target: dict
    data: dict
    draft: dict
    loss: dict
    optim: dict
    train: dict

    @classmethod
    def from_dict(cls, raw: dict | None) -> "TrainConfig":
        raw = raw or {}
        require(isinstance(raw, dict), "training config must be a YAML mapping of sections")
        for section in raw:
            require(section in SCHEMA, f"unknown config section '{section}' (expected one of {', '.join(SCHEMA)})")
        sections = {}
        for section, keys in SCHEMA.items():
            given = raw.get(section) or {}
            if section == "target" and isinstance(given, str):  # `target: smollm2` shorthand
                given = {"name": given}
            require(isinstance(given, dict), f"config section '{section}' must be a mapping")
            for key in given:
                require(key in keys, f"unknown config key '{section}.{key}'")
            values = {}
            for key, (kind, default, check, meaning) in keys.items():
                dotted = f"{section}.{key}"
                value = _check_kind(dotted, kind, given.get(key, copy.deepcopy(default)))
                if value is not None and check is not None:
                    require(check(value), f"config key '{dotted}' must be {meaning}, got {value!r}")
                values[key] = value
            sections[section] = values
        config = cls(**sections)
        config._cross_checks()
        return config

    def _cross_checks(self) -> None:
        d, t = self.draft, self.train
        require(t["batch_size"] % t["grad_accum"] == 0,
                f"config key 'train.grad_accum'={t['grad_accum']} must divide train.batch_size={t['batch_size']}")
        require(self.data["max_seq_len"] > d["block_size"],
                f"config key 'data.max_seq_len'={self.data['max_seq_len']} must exceed draft.block_size={d['block_size']}")
        if d["use_conv"]:
            require(d["conv_group_size"] >= 1, "config key 'draft.conv_group_size' must be positive")
        if d["target_layer_ids"] is not None:
            require(len(d["target_layer_ids"]) > 0, "config key 'draft.target_layer_ids' must not be empty")
            require(len(set(d["target_layer_ids"])) == len(d["target_layer_ids"]),
                    "config key 'draft.target_layer_ids' has repeated layers")

    def to_dict(self) -> dict:
        return {name: copy.deepcopy(getattr(self, name)) for name in SCHEMA}

    def resolved_gamma(self) -> float:
        if self.loss["gamma"] is not None:
            return self.loss["gamma"]
        block = self.draft["block_size"]
        return {8: 4.0, 16: 7.0}.get(block, block / 2)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply dotted `section.key=value` overrides (value parsed as a YAML scalar/list)."""
    raw = copy.deepcopy(raw or {})
    for item in overrides:
        require("=" in item, f"override '{item}' must look like section.key=value")
        dotted, text = item.split("=", 1)
        parts = dotted.strip().split(".")
        require(len(parts) == 2 and all(parts),
                f"override key '{dotted}' must be section.key (e.g. train.steps=100)")
        section, key = parts
        require(section in SCHEMA, f"unknown config section '{section}' in override '{item}'")
        require(key in SCHEMA[section], f"unknown config key '{dotted}' in override '{item}'")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raise DFlash2Error(f"override '{item}': value is not valid YAML") from None
        if section == "target" and isinstance(raw.get("target"), str):
            raw["target"] = {"name": raw["target"]}
        raw.setdefault(section, {})
        require(isinstance(raw[section], dict), f"config section '{section}' must be a mapping")
        raw[section][key] = value
    return raw


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML config (or start from defaults when `path` is None) and apply overrides."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        require(path.is_file(), f"training config '{path}' does not exist")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else "parse error"
            raise DFlash2Error(f"training config '{path}' is not valid YAML: {first}") from None
        require(isinstance(raw, dict), f"training config '{path}' must be a YAML mapping of sections")
    return TrainConfig.from_dict(apply_overrides(raw, list(overrides)))
