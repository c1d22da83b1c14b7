"""llama.cpp as peers of `dflash2 bench --peers llama-cpp,llama-cpp-dflash`: absent, it is
`unavailable` with the way to install it (never a traceback); present, its plain decoding of the
f32 GGUF of the same weights writes what dflash2's plain decoding writes, and its report carries
tokens/s, tau where it speculates, mismatches, its threads and the GGUF type in its name.

The tests that run llama.cpp are skipped where it is not installed
(`scripts/engines/install_llama_cpp.sh`, or $DFLASH2_LLAMA_CPP)."""
from __future__ import annotations

import json

import pytest
from gguf import GGMLQuantizationType, GGUFReader

from dflash2.cli import main
from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.eval import bench, llama_peers
from dflash2.eval.bench_runs import DatasetRun
from dflash2.export import llama_cpp
from dflash2.targets.builtin import BUILTIN_TARGETS, SOURCE_RECORD, open_target

from test_engine_acceptance import LLAMA, _no_llama_cpp_anywhere, needs_llama_cpp


def test_the_llama_peers_are_bench_peers_and_parse(tmp_path):
    assert {"llama-cpp", "llama-cpp-dflash"} <= set(bench.PEER_NAMES)
    settings = bench.parse_args(["--tiny", "--peers", "llama-cpp,llama-cpp-dflash", "--llama-threads", "3",
                                 "--output", str(tmp_path / "a")])
    assert settings.peers == {"llama-cpp", "llama-cpp-dflash"} and settings.llama_threads == 3
    everything = bench.parse_args(["--tiny", "--peers", "--output", str(tmp_path / "b")])
    assert {"llama-cpp", "llama-cpp-dflash", "hf"} <= everything.peers and everything.llama_threads is None


def test_the_thread_count_is_the_first_given_else_torchs():
    import torch

    assert llama_peers.threads(3, 2) == 3 and llama_peers.threads(None, 2) == 2
    assert llama_peers.threads(None, None) == torch.get_num_threads()


def test_only_a_built_in_target_has_a_gguf(tmp_path):
    own = BUILTIN_TARGETS["smollm2"].locate_gguf(tmp_path)
    assert llama_peers.source_gguf("smollm2", tmp_path) == own
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / SOURCE_RECORD).write_text(json.dumps({"target": "smollm2"}))
    assert llama_peers.source_gguf(str(converted), tmp_path) == own   # a built-in's converted directory
    (converted / SOURCE_RECORD).write_text(json.dumps({"target": "elsewhere"}))
    assert llama_peers.source_gguf(str(converted), tmp_path) is None
    assert llama_peers.source_gguf(str(tmp_path), tmp_path) is None


def test_without_llama_cpp_both_peers_are_unavailable_with_the_install_hint(tmp_path, monkeypatch, capsys):
    _no_llama_cpp_anywhere(monkeypatch, tmp_path)
    out = tmp_path / "bench"
    code = main(["bench", "--tiny", "--datasets", "gsm8k", "--num-prompts", "1", "--max-new-tokens", "4",
                 "--threads", "1", "--peers", "llama-cpp,llama-cpp-dflash", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    peers = json.loads((out / "results.json").read_text())["peers"]
    for key, name in (("llama_cpp", "llama.cpp plain (f32 GGUF)"), ("llama_cpp_dflash", "llama.cpp + DFlash2 draft "
                                                                                           "(f32 GGUF)")):
        report = peers[key]
        assert report["status"] == "unavailable" and report["reason"] == llama_cpp.INSTALL_HINT, report
        assert report["name"] == name and report["threads"] == 1 and report["gguf_type"] == "f32"
        assert f"# peers: {key} unavailable: llama.cpp is not installed" in err
        assert f"**{name}, `{key}`**" in (out / "results.md").read_text()


def _job(tmp_path, **changes) -> llama_peers.LlamaJob:
    fields = dict(wanted=frozenset({"llama-cpp"}), target="smollm2", tiny=False, draft=None, precision="float32",
                  threads=1, block_size=8, prompts={"d": [[1, 2]]}, ar_outputs=None, tokenizer=None,
                  config=GenerationConfig(max_new_tokens=4), scratch=tmp_path)
    return llama_peers.LlamaJob(**{**fields, **changes})


def test_what_the_llama_peers_cannot_run_is_said_before_anything_runs(tmp_path):
    assert llama_peers._why_unavailable(_job(tmp_path)) is None
    sampling = _job(tmp_path, config=GenerationConfig(max_new_tokens=4, temperature=1.0))
    assert llama_peers._why_unavailable(sampling) == "llama.cpp peers run greedy only (T=0)"
    assert "float32 or bfloat16" in llama_peers._why_unavailable(_job(tmp_path, precision="float16"))
    assert "tiny" in llama_peers._why_unavailable(_job(tmp_path, tiny=True))
    assert llama_peers.GGUF_TYPES == {"float32": "f32", "bfloat16": "bf16"}
    report = llama_peers.llama_peers(_job(tmp_path, llama_cpp=str(tmp_path)))["llama_cpp"]   # no programs there
    assert report["status"] == "unavailable" and "has no llama-speculative-simple" in report["reason"]


@needs_llama_cpp
def test_llama_cpp_plain_writes_what_dflash2_plain_writes_at_float32(tmp_path, smollm2_cache, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "--datasets", "gsm8k", "--num-prompts", "2", "--max-new-tokens", "12", "--dtype", "float32",
                 "--proposer", "draft", "--threads", "1", "--peers", "llama-cpp,llama-cpp-dflash",
                 "--llama-cpp", str(LLAMA.bin_dir), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    plain, spec = results["peers"]["llama_cpp"], results["peers"]["llama_cpp_dflash"]
    for report in (plain, spec):
        assert report["status"] == "ok", report.get("reason")
        assert report["threads"] == 1 and report["gguf_type"] == "f32" and report["dtype"] == "float32"
        assert " -t 1 " in report["command"] and "llama.cpp" in report["versions"]
        assert not any("tokenizes" in note for note in report["notes"])   # the same prompt ids
        overall = report["overall"]
        assert overall["mismatches"] == 0 and report["datasets"]["gsm8k"]["mismatches"] == 0
        assert 2 <= overall["new_tokens"] <= 2 * (12 + 8) and overall["tokens_per_second"] > 0
        assert overall["time_per_output_token_ms"] == pytest.approx(1000 * overall["seconds"] / overall["new_tokens"])
    assert plain["overall"]["acceptance_length"] == 1.0 and plain["overall"]["speedup"] is None
    assert 1.0 <= spec["overall"]["acceptance_length"] <= 8 and spec["overall"]["speedup"] > 0
    assert "--spec-type draft-dflash --spec-draft-n-max 7" in spec["command"]
    gguf = out / "peer-models" / "SmolLM2-135M-Instruct.Q4_1.f32.gguf"
    assert {t.tensor_type for t in GGUFReader(str(gguf)).tensors} == {GGMLQuantizationType.F32}
    markdown = (out / "results.md").read_text()
    assert "| llama.cpp plain (f32 GGUF) | overall |" in markdown
    assert "| llama.cpp + DFlash2 draft (f32 GGUF) | overall |" in markdown
    assert "# peers: llama.cpp plain (f32 GGUF): " in err

    run = DatasetRun.from_dict(json.loads((out / "parts" / "dataset-gsm8k.json").read_text())["payload"])
    assert plain["overall"]["new_tokens"] == sum(len(o) for o in run.outputs)   # as many tokens as dflash2's
    # the comparison is not blind: against a reference changed in one token, that prompt mismatches
    tokenizer = open_target("smollm2").tokenizer
    changed = [list(run.outputs[0]), list(run.outputs[1])]
    changed[1][0] = (changed[1][0] + 1) % len(tokenizer)
    job = _job(out / "peer-models", prompts={"gsm8k": run.prompts}, ar_outputs={"gsm8k": changed},
               tokenizer=tokenizer, config=GenerationConfig(max_new_tokens=12), llama_cpp=str(LLAMA.bin_dir))
    report = llama_peers.llama_peers(job)["llama_cpp"]
    assert report["status"] == "ok" and report["overall"]["mismatches"] == 1
