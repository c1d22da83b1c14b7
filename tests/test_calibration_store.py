"""The cost model's start-up calibration is measured once per machine, target and dtype, stored in
the dflash2 cache, and measured again when any of them changes, when it is old, or on request; what
a run observes replaces a stored calibration it contradicts."""
from __future__ import annotations

import json
import time

import pytest

from dflash2.files.calibration import MAX_AGE_S
from dflash2.decoding.policy import costs as costs_module
from dflash2.decoding.policy.costs import CostModel
from dflash2.decoding.loop.engine import GenerationConfig, GenerationResult
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_prompt
from matrix_util import template, work  # noqa: F401 (fixtures)


@pytest.fixture
def measured(work, monkeypatch):
    """The (dtype, block) of every real calibration, with the cache in the workplace."""
    monkeypatch.setenv("DFLASH2_CACHE", str(work / "cache"))
    calls = []
    real = CostModel.calibrate

    def counting(self, target, block, *args, **kwargs):
        calls.append((str(target.dtype), block))
        return real(self, target, block, *args, **kwargs)
    monkeypatch.setattr(CostModel, "calibrate", counting)
    return calls


@pytest.fixture
def steady(monkeypatch):
    """A tiny model's passes take milliseconds, and on a shared host their noise can contradict any
    calibration: here the staleness rule (tested below with a contradiction far beyond noise) is off."""
    monkeypatch.setattr(costs_module, "STALE_FACTOR", 1e9)


def _decode(dtype: str = "float32") -> list[int]:
    pipe = load_decoder("target", "draft", dtype=dtype, speculate="auto")
    ids = encode_prompt(pipe.tokenizer, "hello there", False)
    return pipe.decoder.generate([ids], GenerationConfig(max_new_tokens=8))[0].tokens


def test_calibration_is_stored_and_reused(work, measured, steady, monkeypatch):
    first = _decode()
    assert measured == [("torch.float32", 8)]
    assert len(list((work / "cache" / "calibration").glob("*.json"))) == 1
    assert _decode() == first and measured == [("torch.float32", 8)]       # reused: no second measurement
    _decode("bfloat16")
    assert measured[-1] == ("torch.bfloat16", 8)                            # another dtype: measured
    monkeypatch.setenv("DFLASH2_RECALIBRATE", "1")
    _decode()
    assert len(measured) == 3                                               # on request: measured again


def _stored(work) -> tuple:
    (path,) = (work / "cache" / "calibration").glob("*.json")
    return path, json.loads(path.read_text())


def _lookup_decode() -> GenerationResult:
    pipe = load_decoder("target", proposer="lookup", speculate="auto", dtype="float32")
    ids = encode_prompt(pipe.tokenizer, "abcabcabcabcabcabcabcabc", False)
    return pipe.decoder.generate([ids], GenerationConfig(max_new_tokens=64))[0]


def test_a_calibration_stored_under_load_is_probed_past_and_replaced(work, measured, monkeypatch):
    """The stored figures say every wide pass costs 1000 plain steps (measured while the machine was
    loaded): lookup still gets verified, and what the run observed replaces the stored figures."""
    factor = costs_module.STALE_FACTOR
    # the tiny target's answers copy little: lookup is verified a few times, at widths that depend
    # on the host's timings, so here one pass of a width counts as observed (4 in the library)
    monkeypatch.setattr(costs_module, "STALE_SAMPLES", 1)
    monkeypatch.setattr(costs_module, "STALE_FACTOR", 1e9)     # the honest run stores what it measured
    honest = _lookup_decode()
    path, record = _stored(work)
    plain = {q: s for _, q, s in record["verify"]}[1]
    record["verify"] = [[b, q, s if q == 1 else 1000 * plain] for b, q, s in record["verify"]]
    path.write_text(json.dumps(record))
    monkeypatch.setattr(costs_module, "STALE_FACTOR", factor)
    result = _lookup_decode()
    assert result.tokens == honest.tokens                                   # lossless either way
    assert result.stats.as_dict()["cycles_by_source"].get("lookup", 0) > 0  # speculation was not switched off
    assert len(measured) == 1                                               # no second start-up measurement
    stored = {q: s for _, q, s in _stored(work)[1]["verify"]}
    assert stored and all(s < 100 * plain for s in stored.values())         # replaced by what was observed


def test_an_old_calibration_is_measured_again(work, measured, steady):
    _decode()
    path, record = _stored(work)
    record["measured_at"] -= MAX_AGE_S + 1
    path.write_text(json.dumps(record))
    _decode()
    assert len(measured) == 2
    assert time.time() - _stored(work)[1]["measured_at"] < 60


@pytest.mark.parametrize("command", ["generate", "bench", "analyze", "yardstick", "serve"])
def test_every_command_that_decodes_takes_recalibrate(command, capsys):
    from dflash2.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--recalibrate" in capsys.readouterr().out


def test_a_stored_table_without_a_plain_step_is_measured_again(work, measured, steady):
    """Figures of wide passes alone would price the plain step by extrapolation (as dear as a wide
    pass), and speculation would always look as if it paid: such a table is not used."""
    _decode()
    path, record = _stored(work)
    record["verify"] = [[b, q, s] for b, q, s in record["verify"] if q > 1]
    path.write_text(json.dumps(record))
    _decode()
    assert len(measured) == 2
    assert any(q == 1 for _, q, _ in _stored(work)[1]["verify"])
