"""Bad input: each mistake gives one clear line naming what is wrong, from the API and the CLI."""
from __future__ import annotations

import copy
import json

import pytest

from dflash2.cli import main
from dflash2.model.config import DFlash2Config
from dflash2.decoding.engine import GenerationConfig, SpeculativeDecoder
from dflash2.errors import DFlash2Error
from dflash2.decoding.target import TargetAdapter
from dflash2.targets.tiny import tiny_draft, tiny_target
from test_checkpoint import QWEN38_27B_DRAFT


def broken(**changes):
    config = copy.deepcopy(QWEN38_27B_DRAFT)
    for key, value in changes.items():
        section = config["dflash_config"] if key in config["dflash_config"] or key == "mask_token_id" else config
        if value is None:
            section.pop(key)
        else:
            section[key] = value
    return config


@pytest.mark.parametrize("changes, words", [
    (dict(dflash_config=None), "dflash_config"),
    (dict(mask_token_id=None), "mask_token_id"),
    (dict(hidden_size=None), "hidden_size"),
    (dict(target_layer_ids=None), "target_layer_ids"),
    (dict(target_layer_ids=[5, 19, 64]), "target_layer_ids"),
    (dict(mask_token_id=248320), "mask_token_id"),
    (dict(conv_group_size=7), "conv_group_size"),
    (dict(num_key_value_heads=7), "num_key_value_heads"),
])
def test_config_errors_name_the_field(changes, words):
    with pytest.raises(DFlash2Error, match=words) as info:
        DFlash2Config.from_dict(broken(**changes))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("field, value", [
    ("max_new_tokens", 0), ("max_new_tokens", -3), ("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -1), ("block_size", 1),
])
def test_generation_config_errors(field, value):
    with pytest.raises(DFlash2Error, match=field):
        GenerationConfig(**{field: value}).validate()


def test_draft_target_mismatch():
    small, other = tiny_target("llama"), tiny_target("llama", vocab_size=96)
    draft = tiny_draft(small)
    with pytest.raises(DFlash2Error, match="vocab"):
        SpeculativeDecoder(TargetAdapter(other, draft.config.target_layer_ids), draft)
    wide = tiny_target("llama", hidden_size=96)
    with pytest.raises(DFlash2Error, match="hidden size"):
        SpeculativeDecoder(TargetAdapter(wide, draft.config.target_layer_ids), draft)


def test_empty_and_too_long_prompts(tiny_models):
    target, draft = tiny_models["llama"]
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft)
    with pytest.raises(DFlash2Error, match="empty prompt"):
        decoder.generate([[]], GenerationConfig())
    with pytest.raises(DFlash2Error, match="context limit"):
        decoder.generate([[5] * 500], GenerationConfig(max_new_tokens=20))


def test_recurrent_target_refused(tiny_models):
    target, _ = tiny_models["llama"]
    target.config.layer_types = ["linear_attention"] + ["full_attention"] * 5
    try:
        with pytest.raises(DFlash2Error, match="recurrent"):
            TargetAdapter(target, [1])
    finally:
        del target.config.layer_types


def run_cli(capsys, *argv):
    """Run the CLI in-process; returns the exit code and the last stderr line (progress bars of a
    model load may come before it), after checking there is no traceback."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, words", [
    (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt", "hi", "--top-p", "1.5"], "top_p"),
    (["--prompt", "   "], "empty prompt"),
    (["--prompt", "hi", "--target", "no-such-model"], "unknown target 'no-such-model'"),
    (["--prompt", "hi", "--dtype", "float64"], "dtype"),
])
def test_cli_errors_are_one_line(capsys, argv, words):
    code, err = run_cli(capsys, "generate", *argv)
    assert code == 2
    assert err.startswith("error: ") and words in err and "\n" not in err and "Traceback" not in err


def test_cli_bad_draft_config(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(broken(mask_token_id=None)))
    code, err = run_cli(capsys, "generate", "--prompt", "hi", "--draft", str(tmp_path))
    assert code == 2 and "mask_token_id" in err and "\n" not in err


def test_cli_draft_for_another_target(capsys, tmp_path):
    tiny_draft(tiny_target("llama")).save_pretrained(tmp_path / "d")
    code, err = run_cli(capsys, "generate", "--prompt", "hi", "--draft", str(tmp_path / "d"))
    assert code == 2 and "mismatch" in err and "\n" not in err
