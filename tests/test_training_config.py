"""Training config: defaults, dotted overrides, shipped configs, and one-line errors naming the key."""
from __future__ import annotations

from pathlib import Path

import pytest


from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import tiny_target
from dflash2.training.config import TrainConfig, load_config
from dflash2.training.model import draft_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("target: smollm2\ndraft:\n  num_layers: 2\n")
    cfg = load_config(path, ["train.steps=100", "draft.use_selector=false", "optim.betas=[0.8, 0.9]",
                             "data.train=some/dir"])
    assert cfg.target["name"] == "smollm2" and cfg.draft["num_layers"] == 2
    assert cfg.train["steps"] == 100 and cfg.draft["use_selector"] is False
    assert cfg.optim["betas"] == [0.8, 0.9] and cfg.data["train"] == ["some/dir"]
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
    assert cfg.target["name"] == "smollm2"
    assert cfg.draft["use_conv"] == (name in ("smollm2-dflash2", "smollm2-conv-only"))
    assert cfg.draft["use_selector"] == (name in ("smollm2-dflash2", "smollm2-selector-only"))


def test_precision_auto_picks_bf16_only_where_it_is_fast():
    import torch

    from dflash2.training.trainer import autocast_dtype

    cpu = torch.device("cpu")
    assert autocast_dtype("fp32", cpu) is None
    assert autocast_dtype("bf16", cpu) is torch.bfloat16
    assert autocast_dtype("auto", torch.device("cuda")) is torch.bfloat16
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert autocast_dtype("auto", cpu) is (torch.bfloat16 if native else None)
