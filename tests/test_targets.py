"""Tests for dflash2.targets.builtin: name resolution, the cache location, and one real SmolLM2 conversion."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets import builtin as targets
from dflash2.errors import DFlash2Error


def test_registry_lists_both_builtins_with_smollm2_default():
    assert list(targets.BUILTIN_TARGETS) == ["smollm2", "gemma3"]
    assert targets.DEFAULT_TARGET == "smollm2"
    for name, spec in targets.BUILTIN_TARGETS.items():
        assert spec.name == name
        assert spec.description and "\n" not in spec.description
        assert spec.gguf_file.endswith(".gguf") and spec.gguf_file in spec.source


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH2_CACHE", str(tmp_path / "c"))
    assert targets.cache_dir() == tmp_path / "c"
    assert targets.builtin_dir("gemma3") == tmp_path / "c" / "targets" / "gemma3"


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("DFLASH2_CACHE", raising=False)
    assert targets.cache_dir() == Path.home() / ".cache" / "dflash2"


def test_unknown_target_error_names_it_and_lists_builtins():
    with pytest.raises(DFlash2Error) as info:
        targets.resolve_target("foo")
    message = str(info.value)
    assert message == (
        "unknown target 'foo': not a built-in (smollm2, gemma3), a local directory, or a hub id"
    )
    assert "\n" not in message


@pytest.mark.parametrize("bad", ["", "/no/such/dir", "./missing/model", "a/b/c", "../x/y"])
def test_paths_that_do_not_exist_are_errors(bad):
    with pytest.raises(DFlash2Error, match="unknown target"):
        targets.resolve_target(bad)


def test_local_directory_passes_through(tmp_path):
    assert targets.resolve_target(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("hub_id", ["HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m"])
def test_hub_id_passes_through(hub_id):
    assert targets.resolve_target(hub_id) == hub_id


def test_convert_unknown_builtin_is_an_error():
    with pytest.raises(DFlash2Error, match="unknown built-in target 'nope'.*smollm2, gemma3"):
        targets.convert_builtin("nope")


def test_failed_conversion_leaves_nothing_behind(monkeypatch, tmp_path):
    def broken(scratch: Path) -> Path:
        (scratch / "x.gguf").write_bytes(b"not a gguf")  # fails inside the atomic build
        return scratch / "x.gguf"

    spec = targets.BuiltinTarget("broken", "a target whose GGUF is garbage", "none", "x.gguf", broken)
    monkeypatch.setitem(targets.BUILTIN_TARGETS, "broken", spec)
    monkeypatch.setenv("DFLASH2_CACHE", str(tmp_path))
    with pytest.raises(Exception):
        targets.convert_builtin("broken")
    assert list((tmp_path / "targets").iterdir()) == []


def test_smollm2_conversion_writes_a_plain_float32_checkpoint(smollm2_cache):
    cache, directory = smollm2_cache
    assert directory == cache / "targets" / "smollm2"
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["vocab_size"] == 49152
    assert "quantization_config" not in config
    record = json.loads((directory / targets.SOURCE_RECORD).read_text())
    assert record["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(record["gguf_sha256"]) == 64 and record["gguf_size"] > 0
    assert record["transformers_version"]
    assert [p.name for p in cache.glob("targets/.*")] == []  # no temporary leftovers


def test_smollm2_loads_without_gguf_and_keeps_chat_template(smollm2_cache, monkeypatch):
    cache, directory = smollm2_cache
    monkeypatch.setenv("DFLASH2_CACHE", str(cache))
    stamp = (directory / targets.SOURCE_RECORD).stat().st_mtime_ns
    model, tokenizer = targets.load_target("smollm2")
    assert (directory / targets.SOURCE_RECORD).stat().st_mtime_ns == stamp  # reused, not reconverted
    assert not model.training
    assert type(model).__name__ == "LlamaCausalLM"          # dflash2's own Llama (targets.llama) by default
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token is not None
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi<|im_end|>" in text
    reference, _ = targets.load_target("smollm2", implementation="transformers")
    assert type(reference).__name__ == "LlamaForCausalLM"
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = reference.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])
    ours = SpeculativeDecoder(TargetAdapter(model)).generate([ids[0].tolist()], GenerationConfig(max_new_tokens=24))
    assert ours[0].tokens == out[0, ids.shape[1]:].tolist()   # the same target, token for token
