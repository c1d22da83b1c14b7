"""The cost model's start-up calibration is measured once per machine, target and dtype, stored in
the dflash2 cache, and measured again when any of them changes or on request."""
from __future__ import annotations

import pytest

from dflash2.decoding.costs import CostModel
from dflash2.decoding.engine import GenerationConfig
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


def _decode(dtype: str = "float32") -> list[int]:
    pipe = load_decoder("target", "draft", dtype=dtype, speculate="auto")
    ids = encode_prompt(pipe.tokenizer, "hello there", False)
    return pipe.decoder.generate([ids], GenerationConfig(max_new_tokens=8))[0].tokens


def test_calibration_is_stored_and_reused(work, measured, monkeypatch):
    first = _decode()
    assert measured == [("torch.float32", 8)]
    assert len(list((work / "cache" / "calibration").glob("*.json"))) == 1
    assert _decode() == first and measured == [("torch.float32", 8)]       # reused: no second measurement
    _decode("bfloat16")
    assert measured[-1] == ("torch.bfloat16", 8)                            # another dtype: measured
    monkeypatch.setenv("DFLASH2_RECALIBRATE", "1")
    _decode()
    assert len(measured) == 3                                               # on request: measured again
