"""Resumable bench parts: a part is reused only for the very configuration, weights and code that
made it, and a part of anything else is recomputed (never mixed into a table)."""
from __future__ import annotations

import json

import torch

from dflash2.eval.parts import PACKAGE_DIR, PartStore, code_digest, run_fingerprint, weights_digest


def test_the_fingerprint_covers_the_whole_package_not_only_the_bench():
    """The decoding policy decides the numbers as much as the bench code does: a part measured before
    a change to `decoding/policy/` must not be resumed after it (the digest once covered `eval/` only)."""
    assert (PACKAGE_DIR / "decoding" / "policy" / "learner.py").is_file()
    assert run_fingerprint({}, "w") == run_fingerprint({}, "w", PACKAGE_DIR)
    assert run_fingerprint({}, "w") != run_fingerprint({}, "w", PACKAGE_DIR / "eval")


def test_every_input_changes_the_fingerprint(tmp_path):
    (tmp_path / "pkg" / "decoding").mkdir(parents=True)
    source = tmp_path / "pkg" / "decoding" / "policy.py"
    source.write_text("patience = 3\n")
    base = run_fingerprint({"num_prompts": 20}, "w", tmp_path / "pkg")
    assert base == run_fingerprint({"num_prompts": 20}, "w", tmp_path / "pkg")
    assert base != run_fingerprint({"num_prompts": 21}, "w", tmp_path / "pkg")
    assert base != run_fingerprint({"num_prompts": 20}, "v", tmp_path / "pkg")
    before = code_digest(tmp_path / "pkg")
    source.write_text("patience = 4\n")
    assert code_digest(tmp_path / "pkg") != before
    assert base != run_fingerprint({"num_prompts": 20}, "w", tmp_path / "pkg")


def test_weights_digest_sees_one_changed_value():
    model = torch.nn.Linear(3, 2)
    before = weights_digest(model)
    with torch.no_grad():
        model.weight[0, 0] += 1e-3
    assert weights_digest(model) != before
    assert weights_digest(None) != weights_digest(model)


def test_a_part_is_reused_only_when_resuming_with_the_same_fingerprint(tmp_path):
    PartStore(tmp_path, "a" * 64, resume=False).save("dataset-gsm8k", {"tau": 2.0})
    assert PartStore(tmp_path, "a" * 64, resume=False).load("dataset-gsm8k") is None   # not resuming
    same = PartStore(tmp_path, "a" * 64, resume=True)
    assert same.load("dataset-gsm8k") == {"tau": 2.0} and same.reused == ["dataset-gsm8k"]
    other = PartStore(tmp_path, "b" * 64, resume=True)
    assert other.load("dataset-gsm8k") is None and other.reused == []
    other.save("dataset-gsm8k", {"tau": 3.0})                     # recomputed: overwritten whole
    record = json.loads((tmp_path / "parts" / "dataset-gsm8k.json").read_text())
    assert record["fingerprint"] == "b" * 64 and record["payload"] == {"tau": 3.0}
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["dataset-gsm8k.json"]   # no temporary left


def test_a_torn_part_is_recomputed_not_trusted(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "dataset-mbpp.json").write_text('{"fingerprint": "a')
    assert PartStore(tmp_path, "a", resume=True).load("dataset-mbpp") is None
