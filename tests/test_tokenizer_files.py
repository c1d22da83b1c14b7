"""A converted target's added tokens are recorded in its tokenizer config, so that transformers opens
it without parsing the whole tokenizer.json in Python (0.4 s of every start for SmolLM2), and
the tokenizer it builds is the same."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from transformers import AutoTokenizer

from dflash2.targets import builtin as targets
from dflash2.targets.tokenizer_files import FIELD, record_added_tokens
from matrix_util import tiny_tokenizer


@pytest.fixture
def parsed(monkeypatch):
    """The names of the files `json.load` parses."""
    names = []
    real = json.load

    def spying(handle, *args, **kwargs):
        names.append(os.path.basename(getattr(handle, "name", "")))
        return real(handle, *args, **kwargs)
    monkeypatch.setattr(json, "load", spying)
    return names


def _same(a, b) -> None:
    text = "<s>abc </s>xyz<unk> <pad>"
    assert a.added_tokens_decoder == b.added_tokens_decoder and a.all_special_ids == b.all_special_ids
    assert a(text).input_ids == b(text).input_ids and a.decode(a(text).input_ids) == b.decode(b(text).input_ids)
    assert (a.bos_token, a.eos_token, a.pad_token, a.unk_token) == (b.bos_token, b.eos_token, b.pad_token, b.unk_token)


def test_recorded_tokens_spare_the_python_parse_and_build_the_same_tokenizer(tmp_path, parsed):
    tiny_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {k: v for k, v in json.loads((tmp_path / "tokenizer_config.json").read_text()).items() if k != FIELD}))
    before = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert "tokenizer.json" in parsed                     # without the record: parsed in Python
    assert record_added_tokens(tmp_path) and not record_added_tokens(tmp_path)    # written once
    parsed.clear()
    after = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert "tokenizer.json" not in parsed
    _same(before, after)


def test_a_directory_that_cannot_be_recorded_is_left_alone(tmp_path):
    assert not record_added_tokens(tmp_path)                                   # no files
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("not json")
    assert not record_added_tokens(tmp_path) and (tmp_path / "tokenizer_config.json").read_text() == "{}"


def test_a_builtin_converted_before_the_record_gets_it_when_opened(smollm2_cache, tmp_path, monkeypatch):
    _, converted = smollm2_cache
    assert FIELD in json.loads((converted / "tokenizer_config.json").read_text())   # conversions record it
    old = tmp_path / "targets" / "smollm2"                  # a conversion made before they did
    old.mkdir(parents=True)
    for item in converted.iterdir():
        if item.name == "model.safetensors":
            os.symlink(item, old / item.name)
        else:
            shutil.copy(item, old / item.name)
    config = json.loads((old / "tokenizer_config.json").read_text())
    del config[FIELD]
    (old / "tokenizer_config.json").write_text(json.dumps(config))
    monkeypatch.setenv("DFLASH2_CACHE", str(tmp_path))
    files = targets.open_target("smollm2")
    assert FIELD in json.loads((old / "tokenizer_config.json").read_text())
    _same(files.tokenizer, AutoTokenizer.from_pretrained(converted, local_files_only=True))
