"""Engine peers of `dflash2 bench --peers` (vLLM CPU, MLX dflash): a missing venv is `unavailable`
with the command that makes it, never a crash; a runner's answer becomes a peer report with tau
over verification passes (the prefill's token excluded) and mismatches against dflash2."""
from __future__ import annotations

import json
import stat
from pathlib import Path

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.eval import bench, engine_peers, peers
from dflash2.targets.tiny import tiny_draft, tiny_target

SPECS = {spec.short: spec for spec in engine_peers.ENGINE_PEERS}


def test_engine_peers_are_bench_peers():
    assert {"vllm", "vllm-dflash", "mlx-dflash"} <= set(bench.PEER_NAMES)


def test_missing_venv_is_unavailable_with_the_setup_command(tmp_path):
    for spec in engine_peers.ENGINE_PEERS:
        report = engine_peers.engine_peer(spec, str(tmp_path / "no-python"), str(tmp_path), None, {"d": [[1, 2]]},
                                          None, GenerationConfig(), (), tmp_path)
        assert report["status"] == "unavailable" and spec.setup in report["reason"], report


def _fake_python(tmp_path: Path, answer: dict) -> Path:
    """A stand-in for the venv's python: swallows the request, writes `answer` as the result file."""
    canned = tmp_path / "answer.json"
    canned.write_text(json.dumps(answer))
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\ncat > {tmp_path}/request.json\ncp {canned} \"$2\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_runner_answer_becomes_a_report_with_pooled_tau(tmp_path):
    target = tiny_target("llama")
    src = tmp_path / "draft"
    tiny_draft(target).save_pretrained(src)
    runs = [{"tokens": [5, 6, 7, 8], "acceptance_lengths": [2, 1], "seconds": 1.0},  # 1 prefill token + 2 cycles
            {"tokens": [9, 9], "acceptance_lengths": [1], "seconds": 1.0}]
    exe = _fake_python(tmp_path, {"ok": True, "engine": "vllm", "speculative": True, "notes": ["n"],
                                  "versions": {"vllm": "0.32.0"}, "datasets": {"d": runs}})
    refs = {"d": [[5, 6, 7, 8], [9, 1]]}
    report = engine_peers.engine_peer(SPECS["vllm-dflash"], str(exe), str(tmp_path), str(src),
                                      {"d": [[1, 2], [3]]}, refs, GenerationConfig(max_new_tokens=4), (2,), tmp_path)
    assert report["status"] == "ok" and report["versions"] == {"vllm": "0.32.0"}
    assert report["overall"]["acceptance_length"] == 4 / 3 and report["overall"]["mismatches"] == 1
    assert report["overall"]["new_tokens"] == 6 and report["overall"]["tokens_per_second"] == 3.0
    request = json.loads((tmp_path / "request.json").read_text())
    exported = json.loads((Path(request["draft"]) / "config.json").read_text())
    assert exported["architectures"] == ["DFlashDraftModel"]  # vLLM CPU gets the v1 export
    assert request["num_speculative_tokens"] == 7 and request["stop_token_ids"] == [2]


def test_a_failing_runner_is_reported_not_raised(tmp_path):
    exe = _fake_python(tmp_path, {"ok": False, "error": "RuntimeError: no CPU backend"})
    report = engine_peers.engine_peer(SPECS["vllm"], str(exe), str(tmp_path), None, {"d": [[1]]}, None,
                                      GenerationConfig(), (), tmp_path)
    assert report["status"] == "failed" and "no CPU backend" in report["reason"]
