"""The test suite never writes into the user's cache: conftest points `cache_dir()` at a session
directory under pytest's temporary root, for every test and for the processes the tests start.
(No test here asks for conftest's fixture by name: they check that it applies without being asked.)"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from dflash2.files.cache import cache_dir
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.pipeline import tiny_pipeline


def test_a_decode_stores_its_calibration_in_a_test_cache_not_home(tmp_path_factory, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))                 # where ~/.cache/dflash2 would be
    monkeypatch.setenv("DFLASH2_RECALIBRATE", "1")        # measured and stored even if stored before
    started = time.time()
    pipe = tiny_pipeline(0, "auto")                       # auto: the cost model is calibrated and stored
    pipe.decoder.generate([[5, 6, 7, 8]], GenerationConfig(max_new_tokens=8))
    assert sorted(home.rglob("*")) == []
    assert cache_dir().is_relative_to(tmp_path_factory.getbasetemp())
    written = [json.loads(p.read_text())["written_at"] for p in (cache_dir() / "calibration").glob("*.json")]
    assert any(at >= started for at in written)


def test_processes_the_tests_start_see_the_same_test_cache(tmp_path_factory):
    assert cache_dir().is_relative_to(tmp_path_factory.getbasetemp())
    assert not cache_dir().is_relative_to(Path.home())
    child = subprocess.run([sys.executable, "-c", "from dflash2.files.cache import cache_dir; print(cache_dir())"],
                           capture_output=True, text=True, timeout=60, check=True)
    assert Path(child.stdout.strip()) == cache_dir()
