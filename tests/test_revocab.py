"""`dflash2.training.revocab`: a draft given a frequency vocabulary without training keeps every
weight, proposes only from the most frequent response tokens (plus the stop tokens), and goes
back to the full vocabulary losslessly; bad input is one line and nothing is overwritten."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dflash2.data.shards import Record, ShardWriter
from dflash2.argparsing import first_paragraph
from dflash2.model.draft import DFlash2DraftModel
from dflash2.targets.tiny import tiny_draft, tiny_target
from dflash2.training.revocab import main


def _data(path, vocab: int):
    rng = np.random.default_rng(0)
    with ShardWriter(path, {"sampling": {"stop_token_ids": [1]}}, shard_size=8) as writer:
        for i in range(24):   # responses mostly from tokens 10..29, a few rarer ones
            common = rng.integers(10, 30, size=30)
            rare = rng.integers(30, vocab, size=2)
            writer.add(Record(f"synthetic:{i}", rng.integers(0, vocab, size=5).astype(np.int32),
                              np.concatenate([common, rare, [1]]).astype(np.int32)))
    return path


def test_reduced_vocabulary_keeps_the_weights_and_the_frequent_tokens(tmp_path, capsys):
    target = tiny_target("llama")
    draft = tiny_draft(target)
    draft.save_pretrained(tmp_path / "full")
    data = _data(tmp_path / "data", target.config.vocab_size)
    assert main([str(tmp_path / "full"), "--data", str(data), "--size", "24", "--out", str(tmp_path / "small")]) == 0
    assert "covering" in capsys.readouterr().out
    small = DFlash2DraftModel.from_pretrained(tmp_path / "small")
    assert small.config.draft_vocab_size == 24
    ids = set(small.draft_token_ids().tolist())
    assert set(range(10, 30)) <= ids and 1 in ids                  # every common token and the stop token
    before, after = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(tmp_path / "small" / "model.safetensors"))
    assert set(after) - set(before) == {"d2t", "t2d"}
    for name, tensor in before.items():
        assert torch.equal(tensor, after[name]), name
    # and back: the full vocabulary again, the same weights as the original
    assert main([str(tmp_path / "small"), "--data", str(data), "--size", "0", "--out", str(tmp_path / "back")]) == 0
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(back) == set(before) and all(torch.equal(back[n], before[n]) for n in before)


def test_bad_input_is_one_line_and_nothing_is_overwritten(tmp_path, capsys):
    target = tiny_target("llama")
    tiny_draft(target).save_pretrained(tmp_path / "full")
    data = _data(tmp_path / "data", target.config.vocab_size)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    for argv, words in [(["--size", "4", "--out", str(out)], "--force"),
                        (["--size", "-1", "--out", str(tmp_path / "new")], "--size"),
                        (["--size", "abc", "--out", str(tmp_path / "new")], "--size"),
                        (["--size", "4", "--out", str(tmp_path / "full")], "--out")]:
        assert main([str(tmp_path / "full"), "--data", str(data), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and err.count("\n") == 0 and words in err, err
    assert main([str(tmp_path / "missing"), "--data", str(data), "--size", "4", "--out", str(tmp_path / "n")]) == 2
    assert "missing" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"] and not (tmp_path / "new").exists()


def test_its_help_describes_it_in_whole_sentences(capsys):
    """`--help` gives the docstring's first paragraph, not its first line cut mid-sentence."""
    assert first_paragraph("`x`: a sentence that runs\n  over two lines.\n\nContract: more.") == \
        "`x`: a sentence that runs over two lines."
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "the same draft with a frequency-ranked draft vocabulary, without training." in help_text
