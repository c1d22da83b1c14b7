"""Bad input: each mistake gives one clear line naming what is wrong, from the API and the CLI."""
from __future__ import annotations

import copy
import json

import pytest

from dflash2.cli import main
from dflash2.model.config import DFlash2Config
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.errors import DFlash2Error
from dflash2.decoding.verifier.adapter import TargetAdapter
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
    # wrong types name the field too (they used to surface as "invalid config: '>' not supported ..."
    # or as a traceback)
    (dict(rope_theta="fast"), "'rope_theta' must be a number"),
    (dict(layer_types=5), "'layer_types' must be a list of strings"),
    (dict(target_layer_ids=5), "'dflash_config.target_layer_ids' must be a list of integers"),
    (dict(selector_rank="x"), "'dflash_config.selector_rank' must be an integer"),
    (dict(conv_group_size="16"), "'dflash_config.conv_group_size' must be an integer"),
    (dict(block_size=True), "'dflash_config.block_size' must be an integer"),
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
    assert code == 2 and "\n" not in err
    assert "was made for a target with hidden size 64, vocab 128, 6 layers, not for 'smollm2'" in err


def test_a_draft_for_another_target_names_the_target_it_was_made_for():
    from transformers import LlamaConfig

    from dflash2.model.shape import DraftShape
    from dflash2.pipeline import check_draft_fits
    from dflash2.targets.builtin import TargetFiles

    smollm2_like = LlamaConfig(hidden_size=576, vocab_size=49152, num_hidden_layers=30, num_attention_heads=9,
                               num_key_value_heads=3, intermediate_size=1536)
    config = DFlash2Config.for_target(smollm2_like, DraftShape(num_layers=1), mask_token_id=0)
    tiny = TargetFiles("tiny", "tiny", None, tiny_target("llama").config)
    with pytest.raises(DFlash2Error) as info:
        check_draft_fits(config, tiny, "my-draft")
    assert str(info.value).startswith("draft 'my-draft' was made for a target with hidden size 576, vocab 49152, "
                                      "30 layers (e.g. the built-in 'smollm2'), not for 'tiny' (hidden size 64, "
                                      "vocab 128, 6 layers)")
