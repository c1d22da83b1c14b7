"""Token-id shards and target regeneration, on tiny random targets with pre-tokenized prompts."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from dflash2.training import regenerate as regen
from dflash2.decoding.loop.engine import DecodeSession
from dflash2.errors import DFlash2Error
from dflash2.training.data_identity import sampling_fields, target_fields
from dflash2.training.regenerate import Prompt, generate_shards
from dflash2.data.shards import Record, ShardWriter, done_ids, load_manifest, loss_mask, read_records
from dflash2.targets.tiny import tiny_target

STOP = (2,)


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=0)


def make_prompts(n: int, seed: int = 0) -> list[Prompt]:
    rng = random.Random(seed)
    return [Prompt(f"fake:{i}", [1] + [rng.randrange(3, 120) for _ in range(rng.randrange(2, 14))])
            for i in range(n)]


def fields(model, temperature: float = 0.0, max_new_tokens: int = 10) -> dict:
    return {"target": target_fields("tiny-llama", model),
            "prompts": {"source": "fake", "seed": 0},
            "sampling": sampling_fields(max_new_tokens, temperature, 1.0, 0, STOP, None)}


def run(model, prompts, out, temperature: float = 0.0, **kwargs):
    options = dict(max_new_tokens=10, temperature=temperature, stop_ids=STOP, batch_size=3, shard_size=4,
                   progress=False)
    options.update(kwargs)
    return generate_shards(model, prompts, out, fields(model, temperature, options["max_new_tokens"]), **options)


def sample_records(n: int) -> list[Record]:
    rng = np.random.default_rng(0)
    return [Record(f"r{i}", rng.integers(0, 50000, size=int(rng.integers(1, 9))),
                   rng.integers(0, 50000, size=int(rng.integers(0, 7))), "stop" if i % 3 else "length")
            for i in range(n)]


# --------------------------------------------------------------------------- storage

def test_shard_round_trip(tmp_path):
    records = sample_records(7)
    with ShardWriter(tmp_path / "d", {"note": {"x": 1}}, shard_size=3) as writer:
        for record in records:
            writer.add(record)
    manifest = load_manifest(tmp_path / "d")
    assert [s["file"] for s in manifest["shards"]] == ["shard-00000.npz", "shard-00001.npz", "shard-00002.npz"]
    assert [s["records"] for s in manifest["shards"]] == [3, 3, 1]
    assert manifest["note"] == {"x": 1} and manifest["format_version"] == 1
    back = list(read_records(tmp_path / "d"))
    assert [r.id for r in back] == [r.id for r in records]
    for got, want in zip(back, records):
        assert got.prompt.dtype == np.int32 and np.array_equal(got.prompt, want.prompt)
        assert np.array_equal(got.response, want.response) and got.finish_reason == want.finish_reason
    assert done_ids(tmp_path / "d") == {r.id for r in records}
    assert not (tmp_path / "d" / ".writer.lock").exists()
    with np.load(tmp_path / "d" / "shard-00000.npz", allow_pickle=False) as npz:
        assert npz["tokens"].dtype == np.int32 and npz["offsets"].tolist()[0] == 0


def test_loss_mask_reconstruction():
    record = Record("a", [5, 6, 7], [8, 9], "stop")
    mask = record.loss_mask()
    assert mask.tolist() == [False, False, False, True, True]
    assert record.tokens[mask].tolist() == [8, 9]
    assert loss_mask(0, 2).all() and not loss_mask(3, 3).any()


def test_loss_mask_from_stored_shard(tmp_path, target):
    run(target, make_prompts(5), tmp_path / "d")
    for record in read_records(tmp_path / "d"):
        mask = record.loss_mask()
        assert mask.sum() == record.response.size and not mask[: record.prompt_length].any()
        assert np.array_equal(record.tokens[mask], record.response)


def test_bad_directories_are_refused(tmp_path):
    with pytest.raises(DFlash2Error, match="manifest.json is missing"):
        list(read_records(tmp_path))
    (tmp_path / "junk.txt").write_text("x")
    with pytest.raises(DFlash2Error, match="not empty and has no manifest.json"):
        ShardWriter(tmp_path, {})
    data = tmp_path / "d"
    with ShardWriter(data, {}, shard_size=2) as writer:
        for record in sample_records(4):
            writer.add(record)
    shard = data / "shard-00001.npz"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DFlash2Error, match="does not match its sha256"):
        list(read_records(data))
    shard.unlink()
    with pytest.raises(DFlash2Error, match="listed in the manifest but missing"):
        list(read_records(data))
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["counts"]["records"] = 99
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DFlash2Error, match="counts 99 records"):
        load_manifest(data)


def test_writer_refuses_duplicates_and_a_second_writer(tmp_path):
    with ShardWriter(tmp_path, {}) as writer:
        writer.add(Record("a", [1], [2]))
        with pytest.raises(DFlash2Error, match="already stored"):
            writer.add(Record("a", [1], [3]))
        with pytest.raises(DFlash2Error, match="being written by another process"):
            ShardWriter(tmp_path, {})
    with ShardWriter(tmp_path, {}) as writer:  # reopened: ids on disk count too
        with pytest.raises(DFlash2Error, match="already stored"):
            writer.add(Record("a", [1], [3]))


def test_unlisted_shard_file_is_ignored_and_replaced(tmp_path):
    with ShardWriter(tmp_path, {}, shard_size=2) as writer:
        for record in sample_records(2):
            writer.add(record)
    (tmp_path / "shard-00001.npz").write_bytes(b"left over by a crash before the manifest was written")
    assert len(list(read_records(tmp_path))) == 2
    with ShardWriter(tmp_path, {}, shard_size=2) as writer:
        writer.add(Record("new", [1], [2]))
    assert [r.id for r in read_records(tmp_path)][-1] == "new"


# --------------------------------------------------------------------------- regeneration

def test_manifest_counts(tmp_path, target):
    summary = run(target, make_prompts(10), tmp_path / "d")
    manifest = load_manifest(tmp_path / "d")
    records = list(read_records(tmp_path / "d"))
    counts = manifest["counts"]
    assert summary["records_added"] == counts["records"] == len(records) == 10
    assert counts["prompt_tokens"] == sum(r.prompt_length for r in records)
    assert counts["response_tokens"] == sum(r.response.size for r in records) == summary["response_tokens_added"]
    assert sum(counts["finish_reasons"].values()) == 10
    assert counts["finish_reasons"]["length"] == sum(r.response.size == 10 and r.response[-1] not in STOP
                                                     for r in records)
    assert [s["records"] for s in manifest["shards"]] == [4, 4, 2]
    assert manifest["sampling"]["temperature"] == 0.0 and manifest["target"]["model_type"] == "llama"
    prompts = {p.id: p.tokens for p in make_prompts(10)}
    assert all(r.prompt.tolist() == prompts[r.id] for r in records)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_responses_are_the_targets_greedy_output(tmp_path, target, batch_size):
    import torch

    # 9 prompts through 3 rows: rows finish at different times and later prompts join a running batch
    prompts = make_prompts(9)
    run(target, prompts, tmp_path / "d", batch_size=batch_size)
    records = {r.id: r for r in read_records(tmp_path / "d")}
    assert len(records) == 9
    for prompt in prompts:
        ids = torch.tensor([prompt.tokens])
        with torch.no_grad():
            out = target.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=list(STOP), pad_token_id=0)
        assert records[prompt.id].response.tolist() == out[0, len(prompt.tokens):].tolist()


def test_a_running_batch_sheds_the_padding_of_finished_rows(target):
    import torch

    from dflash2.decoding.verifier.adapter import TargetAdapter

    adapter = TargetAdapter(target, None)
    long, short = [1] + list(range(3, 43)), [1, 5, 6]
    adapter.prefill([long, short])
    adapter.step(torch.tensor([[7], [8]]))
    adapter.keep(torch.tensor([1, 1]), 1)
    assert adapter.mask.shape[1] == len(long) + 1
    adapter.select_rows(torch.tensor([1]))                                      # the long row finished
    assert adapter.mask.shape[1] == len(short) + 1 == adapter.cache.layers[0].keys.shape[2]
    adapter.add_rows([[1, 9, 10, 11]])                                          # and a new one joins
    logits, _ = adapter.step(torch.tensor([[12], [13]]))
    adapter.close()
    with torch.no_grad():                                                       # the same logits as alone
        alone = target(torch.tensor([short + [8, 12]])).logits[0, -1]
    torch.testing.assert_close(logits[0, -1], alone, rtol=1e-4, atol=1e-4)


def test_resume_does_not_duplicate(tmp_path, target):
    out = tmp_path / "d"
    run(target, make_prompts(5), out)
    first = {r.id: r.tokens.tolist() for r in read_records(out)}
    summary = run(target, make_prompts(12), out)  # same command, more prompts
    assert summary["records_added"] == 7
    records = list(read_records(out))
    assert sorted(r.id for r in records) == sorted(p.id for p in make_prompts(12))
    assert all(first[r.id] == r.tokens.tolist() for r in records if r.id in first)
    assert run(target, make_prompts(12), out)["records_added"] == 0
    manifest = load_manifest(out)
    assert [entry["records_added"] for entry in manifest["runs"]] == [5, 7, 0]


def test_interrupted_run_keeps_finished_records_and_resumes(tmp_path, target, monkeypatch):
    out = tmp_path / "d"
    real_step = DecodeSession.step
    finished = []

    def flaky_step(self):
        if len(finished) >= 5:
            raise KeyboardInterrupt
        events = real_step(self)
        finished.extend(e.key for e in events if e.result is not None)
        return events

    monkeypatch.setattr(DecodeSession, "step", flaky_step)
    with pytest.raises(KeyboardInterrupt):
        run(target, make_prompts(12), out, shard_size=100)
    assert len(done_ids(out)) == len(finished) >= 5  # every finished record, flushed on the way out
    monkeypatch.setattr(DecodeSession, "step", real_step)
    assert run(target, make_prompts(12), out)["records_added"] == 12 - len(finished)
    assert sorted(done_ids(out)) == sorted(p.id for p in make_prompts(12))


def test_mismatched_settings_are_refused(tmp_path, target):
    out = tmp_path / "d"
    run(target, make_prompts(4), out)
    with pytest.raises(DFlash2Error, match="sampling.temperature = 0.0, not 0.7"):
        run(target, make_prompts(6), out, temperature=0.7)
    with pytest.raises(DFlash2Error, match="sampling.max_new_tokens"):
        run(target, make_prompts(6), out, max_new_tokens=5)
    with pytest.raises(DFlash2Error, match="target.weights_fingerprint"):
        run(tiny_target("llama", seed=1), make_prompts(6), out)
    assert len(done_ids(out)) == 4  # nothing was added by the refused runs


def test_sampled_regeneration_runs(tmp_path, target):
    summary = run(target, make_prompts(4), tmp_path / "d", temperature=0.8)
    assert summary["records_added"] == 4


def test_cli_user_error_is_one_line(capsys, tmp_path):
    assert regen.main(["--target", "no-such-target", "--out", str(tmp_path / "d"), "--num-prompts", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown target 'no-such-target'" in err[0]


def test_in_order_writes_records_in_the_given_order_whatever_order_they_finish(tmp_path):
    from dflash2.data.shards import InOrder

    records = sample_records(6)
    with ShardWriter(tmp_path / "d", {}, shard_size=2) as writer:
        in_order = InOrder(writer, [r.id for r in records])
        for i in (2, 0, 5, 1):
            in_order.put(records[i].id, records[i])
        assert [r.id for r in writer.buffer] == ["r2"] and [s["records"] for s in writer.manifest["shards"]] == [2]
        in_order.put("r3", None)                      # given up: the ones after it go on
        in_order.drain()                              # r4 never came: r5 is written past the gap
    assert [r.id for r in read_records(tmp_path / "d")] == ["r0", "r1", "r2", "r5"]


def test_shards_are_the_same_bytes_whatever_the_batch_size(tmp_path, target):
    # answers of different lengths (stop tokens): rows finish in another order than they started
    prompts = make_prompts(9, seed=4)
    run(target, prompts, tmp_path / "one", batch_size=1, max_new_tokens=24)
    run(target, prompts, tmp_path / "four", batch_size=4, max_new_tokens=24)
    lengths = {r.response.size for r in read_records(tmp_path / "one")}
    assert len(lengths) > 1, "every answer has one length: the test would not reorder anything"
    one, four = (sorted((tmp_path / d).glob("shard-*.npz")) for d in ("one", "four"))
    assert [p.name for p in one] == [p.name for p in four] and len(one) == 3
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(one, four))
