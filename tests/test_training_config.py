"""Training config: defaults, dotted overrides, shipped configs, and one-line errors naming the key."""
from __future__ import annotations

from pathlib import Path

import pytest


from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import tiny_target
from dflash2.training.config import TrainConfig, load_config
from dflash2.training.draft_step import draft_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("target: smollm2\ndraft:\n  num_layers: 2\n")
    cfg = load_config(path, ["train.steps=100", "draft.use_selector=false", "optim.betas=[0.8, 0.9]",
                             "data.train=some/dir"])
    assert cfg.target.name == "smollm2" and cfg.draft.num_layers == 2
    assert cfg.train.steps == 100 and cfg.draft.use_selector is False
    assert cfg.optim.betas == (0.8, 0.9) and cfg.data.train == ("some/dir",)
    assert cfg.resolved_gamma() == 4.0
    assert load_config(None, ["draft.block_size=16"]).resolved_gamma() == 7.0


@pytest.mark.parametrize("raw, key", [
    ({"train": {"batch_size": 0}}, "train.batch_size"),
    ({"train": {"batch_size": "8"}}, "train.batch_size"),
    ({"train": {"precision": "fp16"}}, "train.precision"),
    ({"optim": {"lr": -1}}, "optim.lr"),
    ({"optim": {"betas": [0.9]}}, "optim.betas"),
    ({"loss": {"gamma": 0}}, "loss.gamma"),
    ({"draft": {"use_conv": "yes"}}, "draft.use_conv"),
    ({"draft": {"block_size": 1}}, "draft.block_size"),
    ({"draft": {"num_layer": 3}}, "draft.num_layer"),
    ({"trian": {}}, "trian"),
    ({"train": {"batch_size": 6, "grad_accum": 4}}, "train.grad_accum"),
    ({"data": {"max_seq_len": 8}}, "data.max_seq_len"),
    ({"draft": {"target_layer_ids": [1, 1]}}, "draft.target_layer_ids"),
    ({"loss": {"replay_fraction": 1}}, "loss.replay_fraction"),
    ({"loss": {"replay_fraction": 0.25, "num_anchors": 1}}, "loss.replay_fraction"),
    ({"loss": {"replay_capacity": 0}}, "loss.replay_capacity"),
    ({"loss": {"replay_max_times": 0}}, "loss.replay_max_times"),
    ({"loss": {"replay_fraction": 0.25, "replay_max_accepted": 7}}, "loss.replay_max_accepted"),
])
def test_bad_values_name_the_key(raw, key):
    with pytest.raises(DFlash2Error) as err:
        TrainConfig.from_dict(raw)
    message = str(err.value)
    assert key in message and "\n" not in message


@pytest.mark.parametrize("override, key", [
    ("train.steps", "train.steps"), ("train.nope=1", "train.nope"), ("nope.steps=1", "nope"),
    ("steps=1", "steps"), ("train.steps=[", "train.steps"),
])
def test_bad_overrides_name_the_key(override, key):
    with pytest.raises(DFlash2Error) as err:
        load_config(None, [override])
    assert key in str(err.value) and "\n" not in str(err.value)


def test_target_dependent_checks_name_the_key():
    target = tiny_target("llama")
    for raw, key in (({"draft": {"mask_token_id": 500}}, "draft.mask_token_id"),
                     ({"draft": {"target_layer_ids": [0, 9]}}, "draft.target_layer_ids"),
                     ({"draft": {"conv_group_size": 48}}, "draft.conv_group_size"),
                     ({"draft": {"num_attention_heads": 4, "num_key_value_heads": 3}}, "draft.num_key_value_heads")):
        with pytest.raises(DFlash2Error, match=key.replace(".", r"\.")):
            draft_config(TrainConfig.from_dict(raw), target.config)


@pytest.mark.parametrize("name", ["smollm2-dflash2", "smollm2-dflash-v1", "smollm2-conv-only", "smollm2-selector-only"])
def test_shipped_configs_load(name):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.target.name == "smollm2"
    assert cfg.draft.use_conv == (name in ("smollm2-dflash2", "smollm2-conv-only"))
    assert cfg.draft.use_selector == (name in ("smollm2-dflash2", "smollm2-selector-only"))


def test_precision_auto_picks_bf16_only_where_it_is_fast(monkeypatch):
    import torch

    from dflash2.training.trainer import autocast_dtype

    cpu = torch.device("cpu")
    assert autocast_dtype("fp32", cpu) is None
    assert autocast_dtype("bf16", cpu) is torch.bfloat16
    from dflash2.runtime.devices import native_bfloat16

    assert autocast_dtype("auto", cpu) is (torch.bfloat16 if native_bfloat16("cpu")[0] else None)
    for native, expected in ((True, torch.bfloat16), (False, None)):   # a device's answer decides, CUDA's too
        monkeypatch.setattr("dflash2.training.trainer.native_bfloat16", lambda device, n=native: (n, "patched"))
        assert autocast_dtype("auto", torch.device("cuda")) is expected
        assert autocast_dtype("auto", cpu) is expected


# A checkpoint's copy of configs/smollm2-dflash2.yaml as the string-keyed config wrote it (before the
# sections were dataclasses); minus `optim.clip_selector_separately`, as checkpoints older than it hold.
CHECKPOINT_DICT = {
    "target": {"name": "smollm2"},
    "data": {"train": ["data/regen/smollm2-sharegpt"], "eval": [], "max_seq_len": 1024, "max_eval_sequences": 256,
             "feature_cache_dir": "cache/features"},
    "draft": {"num_layers": 3, "intermediate_size": 1536, "num_attention_heads": None, "num_key_value_heads": None,
              "head_dim": None, "num_taps": None, "target_layer_ids": None, "block_size": 8, "mask_token_id": None,
              "sliding_window": 2048, "use_conv": True, "use_selector": True, "selector_rank": 64,
              "selector_top_k": 16, "conv_group_size": 16, "final_norm_init": 0.1, "warm_start_from_target": True,
              "init_from": None},
    "loss": {"num_anchors": 64, "gamma": None, "selector_weight": 1.0, "selector_grad_to_backbone": False,
             "logits_chunk": 256},
    "optim": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.0, "warmup_fraction": 0.04,
              "min_lr_ratio": 0.1, "grad_clip": 1.0},
    "train": {"steps": 800, "epochs": 1.0, "batch_size": 8, "grad_accum": 1, "seed": 0, "precision": "auto",
              "device": "auto", "parallel": "ddp", "output_dir": "runs/smollm2-dflash2", "log_every": 10,
              "eval_every": None, "checkpoint_every": 100, "keep_checkpoints": 2, "save_dtype": "bf16",
              "progress": True},
}


def test_checkpoint_dict_form_round_trips():
    cfg = TrainConfig.from_dict(CHECKPOINT_DICT)
    assert cfg.optim.clip_selector_separately is True                 # a key added since: its default
    current = cfg.to_dict()
    for section, keys in CHECKPOINT_DICT.items():
        for key, value in keys.items():
            assert current[section][key] == value and type(current[section][key]) is type(value), (section, key)
    assert TrainConfig.from_dict(current) == cfg
    assert load_config(CONFIGS / "smollm2-dflash2.yaml").to_dict() == current


def test_written_train_config_reads_back(tmp_path):
    import yaml

    cfg = load_config(CONFIGS / "smollm2-dflash2.yaml", ["optim.eps=1e-8", "draft.target_layer_ids=[1, 14, 27]"])
    path = tmp_path / "train_config.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    assert load_config(path) == cfg


@pytest.mark.parametrize("text, key, value", [
    ("1e-3", "optim.lr", 1e-3), ("1E-3", "optim.lr", 1e-3), ("6e-4", "optim.lr", 6e-4), ("1.0e-3", "optim.lr", 1e-3),
    (".5", "optim.warmup_fraction", 0.5), ("1e-8", "optim.eps", 1e-8), ("2", "optim.lr", 2.0),
    ("1_000", "train.steps", 1000), ("-1e-2", "train.seed", None),
])
def test_numbers_parse_as_people_write_them(tmp_path, text, key, value):
    section, name = key.split(".")
    if value is None:  # -1e-2 is a number (so an integer key refuses it as one, not as a string)
        with pytest.raises(DFlash2Error, match=r"'train\.seed' must be an integer, got -0\.01"):
            load_config(None, [f"{key}={text}"])
        return
    path = tmp_path / "c.yaml"
    path.write_text(f"{section}:\n  {name}: {text}\n")
    for cfg in (load_config(path), load_config(None, [f"{key}={text}"])):
        got = getattr(getattr(cfg, section), name)
        assert got == value and type(got) is type(value)


@pytest.mark.parametrize("raw, key", [
    ({"train": {"steps": 2.5}}, "train.steps"),
    ({"train": {"progress": 1}}, "train.progress"),
    ({"optim": {"lr": "fast"}}, "optim.lr"),
    ({"optim": {"betas": [0.9, "x"]}}, "optim.betas[1]"),
    ({"optim": {"betas": 0.9}}, "optim.betas"),
    ({"optim": {"betas": [0.9, 0.95, 0.99]}}, "optim.betas"),
    ({"data": {"train": [1]}}, "data.train[0]"),
    ({"draft": {"target_layer_ids": 3}}, "draft.target_layer_ids"),
    ({"draft": {"num_layers": None}}, "draft.num_layers"),
    ({"target": {"name": 5}}, "target.name"),
    ({"draft": [1, 2]}, "draft"),
])
def test_type_errors_name_the_field(raw, key):
    with pytest.raises(DFlash2Error) as err:
        TrainConfig.from_dict(raw)
    assert f"'{key}'" in str(err.value) and "\n" not in str(err.value)


def test_sections_are_frozen_and_check_themselves():
    import dataclasses

    cfg = load_config(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 3
    with pytest.raises(DFlash2Error, match=r"'train\.batch_size'"):
        dataclasses.replace(cfg.train, batch_size=0)
    with pytest.raises(DFlash2Error, match=r"'train\.grad_accum'"):
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=6, grad_accum=4))


@pytest.mark.parametrize("argv", [
    ["c.yaml", "--resume", "train.steps=540", "train.progress=false"],
    ["c.yaml", "train.steps=540", "--resume", "train.progress=false"],
    ["--resume", "c.yaml", "train.steps=540", "train.progress=false"],
    ["c.yaml", "train.steps=540", "train.progress=false", "--resume"],
])
def test_resume_and_overrides_in_any_order(argv):
    from dflash2.training.trainer import TrainCommand, parse_command

    assert parse_command(argv) == TrainCommand("c.yaml", ("train.steps=540", "train.progress=false"), True)
    assert parse_command(["c.yaml"]) == TrainCommand("c.yaml", (), False)


def test_resume_rules_name_real_keys():
    from dflash2.training.config import SECTIONS, section_keys
    from dflash2.training.trainer import LEGACY_VALUES, RESUMABLE_CHANGES

    keys = {f"{name}.{key}" for name in SECTIONS for key in section_keys(name)}
    assert set(RESUMABLE_CHANGES) <= keys and set(LEGACY_VALUES) <= keys
