"""The GPU training path at tiny scale on the CPU: parts and manifests, the wall-clock budget, the
job's features / calibration / training / packing, collect, the GGUF conversion from a path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.model.draft import DFlash2DraftModel
from dflash2.targets.tiny import tiny_target
from dflash2.tools.gpu import job as gpu_job, parts as gpu_parts
from dflash2.training.config import load_config
from dflash2.training.features import FeatureSource
from dflash2.training.trainer import Trainer
from training_util import small_config, synthetic_sequences

REPO = Path(__file__).resolve().parents[1]
KiB = 1024


def _fake_gguf(path: Path, size: int = 300 * KiB) -> bytes:
    data = b"GGUF" + np.random.default_rng(0).bytes(size - 4)
    path.write_bytes(data)
    return data


def test_split_join_and_damaged_or_missing_parts(tmp_path):
    data = _fake_gguf(tmp_path / "model.gguf")
    parts = tmp_path / "parts"
    manifest = gpu_parts.split_file(tmp_path / "model.gguf", parts, [50 * KiB, 80 * KiB])
    sizes = [p["size"] for p in manifest["parts"]]
    assert sizes == [50 * KiB, 80 * KiB, 80 * KiB, 80 * KiB, 10 * KiB] and manifest["size"] == len(data)
    assert gpu_parts.parts_status(parts).complete
    gpu_parts.join_parts(parts, tmp_path / "joined.gguf")
    assert (tmp_path / "joined.gguf").read_bytes() == data

    gpu_parts.split_file(tmp_path / "model.gguf", parts, 200 * KiB)      # a new split drops stale parts
    assert sorted(p.name for p in parts.iterdir()) == ["manifest.json", "model.gguf.part-00", "model.gguf.part-01"]
    part = parts / "model.gguf.part-01"
    damaged = bytearray(part.read_bytes())
    damaged[7] ^= 1
    part.write_bytes(bytes(damaged))
    assert gpu_parts.parts_status(parts).bad == ("model.gguf.part-01",)
    with pytest.raises(DFlash2Error, match=r"part model\.gguf\.part-01 .*sha256 mismatch"):
        gpu_parts.join_parts(parts, tmp_path / "again.gguf")
    assert not (tmp_path / "again.gguf").exists()
    part.unlink()
    with pytest.raises(DFlash2Error, match=r"missing part model\.gguf\.part-01 \(2 of 2\)"):
        gpu_parts.join_parts(parts, tmp_path / "again.gguf")
    with pytest.raises(DFlash2Error, match="no parts manifest"):
        gpu_parts.join_parts(tmp_path / "nowhere", tmp_path / "again.gguf")


def test_part_sizes_and_the_device_call_plan():
    mib = gpu_parts.MiB
    capacity, wheels = 21 * mib, 13 * mib
    first, rest = gpu_parts.part_sizes(capacity, wheels, 60_000_000)
    assert (first, rest) == (8 * mib - gpu_parts.SLACK, 21 * mib - gpu_parts.SLACK)
    manifest = {"parts": [{"name": f"m.gguf.part-{i:02d}", "size": s}
                          for i, s in enumerate([first, rest, rest, rest, rest, 1 * mib])]}
    calls = gpu_parts.plan_calls(".gpu/parts", manifest, ".gpu/wheels", wheels, capacity, 8)
    assert calls[0].carry == (".gpu/wheels", ".gpu/parts/m.gguf.part-00", ".gpu/parts/manifest.json")
    assert "--smoke" in calls[0].command and "--check" in calls[1].command
    assert calls[-1].command == 'bash scripts/gpu/train_on_gpu.sh "$OUT" 8' and len(calls) == 6
    assert all(c.sends <= capacity for c in calls)
    assert sum(len([x for x in c.carry if ".part-" in x]) for c in calls) == 6
    with_prompts = gpu_parts.plan_calls(".gpu/parts", manifest, ".gpu/wheels", wheels, capacity, 8, (".gpu/prompts", 2 * mib))
    assert with_prompts[-1].carry[-2:] == (".gpu/prompts", ".gpu/parts/manifest.json") and len(with_prompts) == 6
    big = gpu_parts.plan_calls(".gpu/parts", manifest, ".gpu/wheels", wheels, capacity, 8, (".gpu/prompts", 20 * mib))
    assert big[-2].carry[0] == ".gpu/prompts" and "--check" in big[-2].command and len(big) == 7
    assert all(c.sends <= capacity for c in with_prompts + big)
    assert gpu_parts.part_sizes(capacity, 20 * mib, 60_000_000) == [rest]          # wheels travel alone
    with pytest.raises(DFlash2Error, match="make the tree smaller"):
        gpu_parts.part_sizes(mib, 0, 60_000_000)


def test_wall_clock_budget_stops_training_and_exports(tmp_path):
    cfg = small_config(tmp_path / "run", train={"steps": 500, "max_wall_seconds": 0.5})
    trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(16))
    summary = trainer.train()
    trainer.close()
    assert 1 <= summary["steps"] < 500 and summary["wall_seconds"] < 10
    assert DFlash2DraftModel.from_pretrained(tmp_path / "run" / "final").config.num_hidden_layers == 2


def _decode_both(target, draft_dir, prompts):
    draft = DFlash2DraftModel.from_pretrained(draft_dir)
    config = GenerationConfig(max_new_tokens=12)
    spec = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, "always").generate(prompts, config)
    plain = SpeculativeDecoder(TargetAdapter(target)).generate(prompts, config)
    return [r.tokens for r in spec], [r.tokens for r in plain]


def test_job_trains_within_its_budget_packs_and_collects(tmp_path):
    target = tiny_target("llama")
    seqs = synthetic_sequences(16)
    cfg = small_config(tmp_path / "run", data={"feature_cache_dir": str(tmp_path / "features")},
                       loss={"distill_weight": 0.5, "distill_top_k": 4},
                       train={"steps": None, "epochs": 6, "checkpoint_every": 5, "save_dtype": "fp32"})
    settings = gpu_job.JobSettings(out_dir=tmp_path / "out", part_bytes=60 * KiB, reserve_seconds=1.0,
                                   calibration_steps=3, min_train_seconds=1.0, feature_batch_tokens=256)
    result = gpu_job.run_training(cfg, gpu_job.Clock(8.0), settings, target, None, seqs, gpu_job.Phases())
    features, plan, summary = result["features"], result["plan"], result["train"]
    assert features == {"computed": 16, "tokens": sum(len(i) for i, _ in seqs), "batched": True, "complete": True}
    assert plan["calibrated_at_step"] == 3 and 3 <= plan["steps"] <= plan["cap"] == 24
    assert summary["steps"] <= plan["steps"] and "final_dir" in summary
    # the batched, padded entries are the ones the trainer computes one sequence at a time
    taps = DFlash2DraftModel.from_pretrained(tmp_path / "run" / "final").config.target_layer_ids
    source = FeatureSource(TargetAdapter(target, taps), tmp_path / "features",
                           next((tmp_path / "features").iterdir()).name, top_k=4)
    ids = seqs[3][0].long()
    online, cached = source._compute_row(ids), source._load(ids)
    assert cached is not None and torch.allclose(online["features"], cached["features"], atol=1e-4)
    assert torch.equal(online["top_ids"], cached["top_ids"])

    names = gpu_job.write_outputs(tmp_path / "run", tmp_path / "out", 60 * KiB, {"status": result["status"]})
    assert len(names) <= gpu_job.MAX_FILES and sorted(names) == sorted(p.name for p in (tmp_path / "out").iterdir())
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["parts"]) >= 2
    for part in manifest["parts"]:
        path = tmp_path / "out" / part["name"]
        assert path.stat().st_size == part["size"] <= 60 * KiB and gpu_parts.sha256_file(path) == part["sha256"]
    assert {c["name"] for c in manifest["contents"]} == {"config.json", "model.safetensors"}

    gpu_parts.unpack_parts(tmp_path / "out", tmp_path / "collected")
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "collected" / name).read_bytes() == (tmp_path / "run" / "final" / name).read_bytes()
    prompts = [seqs[0][0][:6].tolist(), seqs[1][0][:9].tolist()]
    spec, plain = _decode_both(target, tmp_path / "collected", prompts)
    assert spec == plain

    again = gpu_job.run_training(cfg, gpu_job.Clock(8.0), settings, target, None, seqs, gpu_job.Phases())
    if summary["steps"] == plan["steps"]:  # a finished run is only packed again
        assert again["status"] == "finished earlier"
    else:                                  # a run the budget stopped continues on the same plan
        assert again["plan"] == plan and again["train"]["steps"] >= summary["steps"]


def test_a_cut_short_run_resumes_on_its_plan(tmp_path):
    target, seqs = tiny_target("llama"), synthetic_sequences(16)
    cfg = small_config(tmp_path / "run", data={"feature_cache_dir": str(tmp_path / "features")},
                       train={"steps": None, "epochs": 2, "checkpoint_every": 2})
    first = Trainer(cfg, target_model=target, train_sequences=seqs)
    first.train(stop_at=2)                                                  # as if the call was killed
    first.close()
    (tmp_path / "run" / "gpu_plan.json").write_text(json.dumps({"steps": 6, "cap": 8}))
    settings = gpu_job.JobSettings(out_dir=tmp_path / "out", reserve_seconds=1.0, min_train_seconds=1.0)
    result = gpu_job.run_training(cfg, gpu_job.Clock(60.0), settings, target, None, seqs, gpu_job.Phases())
    assert result["status"] == "finished" and result["train"]["steps"] == 6
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_preflight_names_what_is_missing(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("gguf", "yaml") else real(name, *a))
    with pytest.raises(DFlash2Error, match=r"^missing Python packages: PyYAML, gguf \(carry them as wheels"):
        gpu_job.preflight(need_gguf=True, need_cuda=False)
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if not torch.cuda.is_available():
        with pytest.raises(DFlash2Error, match="^no CUDA device"):
            gpu_job.preflight(need_gguf=False, need_cuda=True)


def test_smoke_command_and_collect_script(tmp_path, capsys):
    out = tmp_path / "out"
    assert gpu_job.main(["smoke", str(out), "--work", str(tmp_path / "work"), "--minutes", "0.1",
                         "--part-mb", "0.1"]) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "smoke passed"
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", str(REPO / "scripts/gpu/collect.sh"), str(out), str(tmp_path / "draft")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["files"] == ["config.json", "model.safetensors"]
    capsys.readouterr()
    assert gpu_parts.main(["collect", str(out), str(tmp_path / "draft")]) == 2      # DEST exists: refused
    assert capsys.readouterr().err.startswith("error: DEST")
    assert gpu_job.main(["train", str(out), "--bogus"]) == 2
    assert capsys.readouterr().err.strip().endswith("unrecognized arguments: --bogus")


def _tiny_gguf(path: Path) -> None:
    """A 2-layer Llama GGUF with a byte-level BPE tokenizer, written with the gguf package."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    hidden, ffn, layers, heads, kv = 64, 128, 2, 4, 2
    merges = ["Ġ t", "h e"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(), "Ġt", "he"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers), w.add_context_length(256), w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn), w.add_head_count(heads), w.add_head_count_kv(kv), w.add_rope_freq_base(1e4)
    w.add_layer_norm_rms_eps(1e-5), w.add_vocab_size(len(tokens)), w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("smollm"), w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3)), w.add_token_merges(merges)
    w.add_bos_token_id(1), w.add_eos_token_id(2), w.add_pad_token_id(2)
    g = np.random.default_rng(0)
    shapes = {"attn_q": (hidden, hidden), "attn_k": (hidden * kv // heads, hidden),
              "attn_v": (hidden * kv // heads, hidden), "attn_output": (hidden, hidden),
              "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    w.add_tensor("token_embd.weight", (0.02 * g.standard_normal((len(tokens), hidden))).astype(np.float32))
    for i in range(layers):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
        for name, shape in shapes.items():
            w.add_tensor(f"blk.{i}.{name}.weight", (0.02 * g.standard_normal(shape)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def test_convert_gguf_from_an_explicit_path(tmp_path):
    from dflash2.targets import builtin

    gguf_path = tmp_path / "tiny.gguf"
    _tiny_gguf(gguf_path)
    gpu_parts.split_file(gguf_path, tmp_path / "parts", 100 * KiB)          # as it travels to the device
    gpu_parts.join_parts(tmp_path / "parts", tmp_path / "joined.gguf")
    out = builtin.convert_gguf(tmp_path / "joined.gguf", tmp_path / "target")
    record = json.loads((out / builtin.SOURCE_RECORD).read_text())
    assert record["gguf_sha256"] == gpu_parts.sha256_file(gguf_path) and record["target"] == "joined"
    model, tokenizer = builtin.load_target(str(out))
    assert model.config.num_hidden_layers == 2 and tokenizer.eos_token == "<|im_end|>"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing half-built left
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    builtin.convert_gguf(tmp_path / "missing.gguf", out)                     # finished: reused, not checked
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(DFlash2Error, match="does not exist"):
        builtin.convert_gguf(tmp_path / "missing.gguf", tmp_path / "other")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(DFlash2Error, match="not a GGUF file"):
        builtin.convert_gguf(tmp_path / "junk.gguf", tmp_path / "other")


def test_convert_gguf_refuses_a_tokenizer_only_gguf_before_loading(tmp_path, monkeypatch):
    """A GGUF with a vocabulary and no tensors made transformers build its architecture's default model
    (a 7B Llama in float32: 27 GB, the test process was killed); it is refused before anything loads."""
    from dflash2.targets import builtin
    from test_export import _tokenizer_gguf

    def must_not_load(gguf):
        raise AssertionError(f"{gguf} was loaded")

    monkeypatch.setattr(builtin, "_dequantized_model", must_not_load)
    with pytest.raises(DFlash2Error, match="holds no model weights"):
        builtin.convert_gguf(_tokenizer_gguf(tmp_path / "vocab.gguf", 300), tmp_path / "target")
    assert not (tmp_path / "target").exists()


def test_gpu_config_has_the_shipped_draft_shape():
    gpu, cpu = load_config(REPO / "configs/smollm2-dflash2-gpu.yaml"), load_config(REPO / "configs/smollm2-dflash2.yaml")
    assert gpu.draft.shape() == cpu.draft.shape() and gpu.draft.warm_start_from_target
    assert gpu.loss.distill_weight == 0.7 and gpu.draft.draft_vocab_size is None
    assert gpu.train.device == "cuda" and gpu.train.precision == "bf16" and gpu.train.save_dtype == "bf16"


def test_device_regeneration_then_training_brings_back_draft_and_shards(tmp_path):
    from dflash2.data.shards import read_records
    from dflash2.tools.gpu import regen
    from dflash2.training.dataset import load_sequences
    from dflash2.training.regenerate import Prompt

    target = tiny_target("llama")
    g = np.random.default_rng(0)
    prompts = [Prompt(f"fake:{i}", [1] + g.integers(3, 120, size=int(g.integers(3, 12))).tolist()) for i in range(10)]
    record = regen.save_prompts(prompts, tmp_path / "prompts", {"sources": {"fake": 10}, "seed": 0,
                                                                "max_prompt_tokens": 64, "selection": "test"})
    loaded, again = regen.load_prompts(tmp_path / "prompts")
    assert [(p.id, p.tokens) for p in loaded] == [(p.id, p.tokens) for p in prompts] and again == record

    import time
    late = regen.regenerate_phase(target, None, "tiny", tmp_path / "prompts", tmp_path / "late", time.time() - 1,
                                  batch_size=4, max_new_tokens=12, stop_ids=(2,))
    assert late["records_added"] == 0 and late["prompts_left"] == 10          # past the deadline: none started
    data = tmp_path / "work" / "regen" / "tiny-device"
    done = regen.regenerate_phase(target, None, "tiny", tmp_path / "prompts", data, time.time() + 60,
                                  batch_size=4, max_new_tokens=12, stop_ids=(2,))
    assert done["records_added"] == 10 and done["prompts_left"] == 0
    answers = {r.id: r.response.tolist() for r in read_records(data)}
    plain = SpeculativeDecoder(TargetAdapter(target)).generate(
        [p.tokens for p in prompts], GenerationConfig(max_new_tokens=12, stop_token_ids=(2,)))
    assert [answers[p.id] for p in prompts] == [r.tokens for r in plain]      # the target's own greedy answers

    seqs, counts = load_sequences([str(data)], 64, False)                   # then train on them
    assert counts["records"] == 10
    cfg = small_config(tmp_path / "run", data={"feature_cache_dir": str(tmp_path / "features")},
                       train={"steps": None, "epochs": 2, "checkpoint_every": 5, "save_dtype": "fp32"})
    settings = gpu_job.JobSettings(out_dir=tmp_path / "out", part_bytes=60 * KiB, reserve_seconds=1.0,
                                   calibration_steps=3, min_train_seconds=1.0, feature_batch_tokens=256)
    result = gpu_job.run_training(cfg, gpu_job.Clock(30.0), settings, target, None, seqs, gpu_job.Phases())
    assert result["train"] is not None
    names = gpu_job.write_outputs(tmp_path / "run", tmp_path / "out", 512 * KiB, {"status": result["status"]}, data)
    assert len(names) <= gpu_job.MAX_FILES and "data/manifest.json" in names and "data/data.tar.part-00" in names
    for name in names:
        assert (tmp_path / "out" / name).stat().st_size <= 512 * KiB
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["data_sha256"]
    collected = regen.collect_data(tmp_path / "out" / "data", tmp_path / "back")  # here: the CPU campaign's data
    assert collected["records"] == 10
    assert {r.id: r.response.tolist() for r in read_records(tmp_path / "back")} == answers
    with pytest.raises(DFlash2Error, match="DEST"):
        regen.collect_data(tmp_path / "out" / "data", tmp_path / "back")       # never over existing data
    (tmp_path / "prompts" / regen.PROMPTS_ARRAYS).write_bytes(b"junk")
    with pytest.raises(Exception):
        regen.load_prompts(tmp_path / "prompts")
