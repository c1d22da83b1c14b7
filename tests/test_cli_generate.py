"""End to end on the built-in default target (SmolLM2-135M-Instruct, converted once into the cache)."""
from __future__ import annotations

import json

from dflash2.cli import main


def run_json(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_generate_compare_json_on_default_target(capsys):
    report = run_json(capsys, "generate", "--prompt", "Name three primary colors.", "--max-new-tokens", "12",
                      "--compare", "--json", "--dtype", "float32")
    for key in ("text", "new_tokens", "acceptance_length", "tokens_per_second", "baseline_tokens_per_second",
                "speedup", "identical"):
        assert key in report
    assert report["identical"] is True
    assert 1 <= report["new_tokens"] <= 12 and report["text"].strip()
    assert 1.0 <= report["acceptance_length"] <= 8.0


def test_init_draft_then_generate_with_it(capsys, tmp_path):
    out = tmp_path / "draft"
    assert main(["init-draft", "--target", "smollm2", "--out", str(out), "--layers", "2", "--selector-rank", "32"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert config["num_target_layers"] == 30 and config["hidden_size"] == 576
    assert config["dflash_config"]["target_layer_ids"] == [1, 27]
    assert config["dflash_config"]["mask_token_id"] == 16  # <empty_output>, a special token chat never uses
    capsys.readouterr()
    report = run_json(capsys, "generate", "--prompt", "Say hello.", "--draft", str(out), "--max-new-tokens", "6",
                      "--temperature", "0.8", "--top-p", "0.95", "--top-k", "20", "--seed", "3", "--json")
    assert 1 <= report["new_tokens"] <= 6


def test_generate_no_draft_streams_text(capsys):
    assert main(["generate", "--prompt", "What is 2+2?", "--no-draft", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "new tokens:" in out and "tok/s" in out
