"""Acceptance across precisions and engines (`dflash2 acceptance`), the unquantized GGUF of a target,
llama.cpp's driver and the advice on whether a draft pays in an engine.

Engine parts run where the engine is installed (llama.cpp: `scripts/engines/install_llama_cpp.sh`
or $DFLASH2_LLAMA_CPP) and skip otherwise; everything else runs everywhere."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType, quants
from safetensors.torch import load_file

from dflash2.cli import main
from dflash2.eval import acceptance
from dflash2.eval import acceptance_arms as arms
from dflash2.export import llama_cpp
from dflash2.export.gguf_target import tensor_values, unquantized_gguf
from dflash2.export.speculation_advice import Measurements, advise
from dflash2.pipeline import shipped_draft_path
from dflash2.targets.builtin import BUILTIN_TARGETS

LLAMA = llama_cpp.find_llama_cpp()
needs_llama_cpp = pytest.mark.skipif(LLAMA is None, reason="llama.cpp is not installed (" + llama_cpp.INSTALL_HINT + ")")


# ------------------------------------------------------------------ unquantized GGUF
def _quantized_gguf(path: Path) -> dict[str, np.ndarray]:
    """A small Llama-like GGUF: Q4_1 and Q8_0 matrices, an F32 norm, a few metadata fields."""
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": (rng.standard_normal((8, 64)), GGMLQuantizationType.Q8_0),
               "blk.0.attn_q.weight": (rng.standard_normal((64, 64)), GGMLQuantizationType.Q4_1),
               "blk.0.attn_norm.weight": (rng.standard_normal(64), GGMLQuantizationType.F32)}
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q4_1))
    writer.add_token_list([f"t{i}" for i in range(8)])
    for name, (values, qtype) in tensors.items():
        values = values.astype(np.float32)
        writer.add_tensor(name, values if qtype == GGMLQuantizationType.F32 else quants.quantize(values, qtype),
                          raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    source = GGUFReader(str(path))
    return {t.name: tensor_values(t) for t in source.tensors}


def test_unquantized_gguf_dequantises_every_tensor_and_keeps_the_metadata(tmp_path):
    values = _quantized_gguf(tmp_path / "q.gguf")
    assert not np.array_equal(values["blk.0.attn_q.weight"].round(), values["blk.0.attn_q.weight"])
    f32 = GGUFReader(str(unquantized_gguf(tmp_path / "q.gguf", tmp_path / "f32.gguf", "float32")))
    assert {t.name: t.tensor_type for t in f32.tensors} == dict.fromkeys(values, GGMLQuantizationType.F32)
    for t in f32.tensors:
        assert np.array_equal(np.asarray(t.data).reshape(values[t.name].shape), values[t.name]), t.name
    assert f32.fields["general.file_type"].contents() == int(LlamaFileType.ALL_F32)
    assert f32.fields["general.architecture"].contents() == "llama"
    assert f32.fields["llama.block_count"].contents() == 1
    assert f32.fields["tokenizer.ggml.tokens"].contents() == [f"t{i}" for i in range(8)]
    bf16 = GGUFReader(str(unquantized_gguf(tmp_path / "q.gguf", tmp_path / "bf16.gguf", "bfloat16")))
    types = {t.name: t.tensor_type for t in bf16.tensors}
    assert types["blk.0.attn_q.weight"] == GGMLQuantizationType.BF16
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32   # 1-D stays F32, as llama.cpp converts
    got = tensor_values(next(t for t in bf16.tensors if t.name == "blk.0.attn_q.weight"))
    want = torch.from_numpy(values["blk.0.attn_q.weight"]).to(torch.bfloat16).float().numpy()
    assert np.array_equal(got, want)


def test_unquantized_gguf_refuses_another_type(tmp_path):
    _quantized_gguf(tmp_path / "q.gguf")
    with pytest.raises(Exception, match="float32, bfloat16"):
        unquantized_gguf(tmp_path / "q.gguf", tmp_path / "x.gguf", "int8")
    assert not (tmp_path / "x.gguf").exists()


def _permuted(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q / K row order (rotary halves interleaved per head), as its converter writes them."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def test_the_f32_gguf_holds_the_weights_dflash2_runs(tmp_path, smollm2_cache):
    """dflash2's SmolLM2 is the float32 dequantisation of the same GGUF: the f32 GGUF's values are
    bit for bit its weights (Q / K in llama.cpp's row order)."""
    hf = load_file(str(smollm2_cache[1] / "model.safetensors"))
    source = {t.name: t for t in GGUFReader(str(BUILTIN_TARGETS["smollm2"].locate_gguf(tmp_path))).tensors}
    pairs = {"token_embd.weight": hf["model.embed_tokens.weight"].numpy(),
             "blk.7.ffn_down.weight": hf["model.layers.7.mlp.down_proj.weight"].numpy(),
             "blk.7.attn_q.weight": _permuted(hf["model.layers.7.self_attn.q_proj.weight"].numpy(), 9),
             "blk.7.attn_k.weight": _permuted(hf["model.layers.7.self_attn.k_proj.weight"].numpy(), 3),
             "blk.7.attn_norm.weight": hf["model.layers.7.input_layernorm.weight"].numpy()}
    for name, weight in pairs.items():
        assert np.array_equal(tensor_values(source[name]), weight), name


# ------------------------------------------------------------------ the advice
def _measurements(width_cost, draft_cost, expected, plain=0.0, measured=None):
    ks = range(1, len(expected) + 1)
    return Measurements({w: c for w, c in enumerate(width_cost, 1)}, dict(zip(ks, draft_cost)),
                        dict(zip(ks, expected)), plain, measured or {})


def test_no_setting_pays_where_verifying_and_drafting_cost_more_than_the_draft_gains():
    # a CPU like the project's: an 8-token verify costs 4 steps, the draft ~1 step, tau ~1.1-1.3
    m = _measurements([1.0, 1.3, 1.6, 1.9, 2.3, 2.8, 3.4, 4.0], [0.9] * 7,
                      [1.10, 1.15, 1.18, 1.20, 1.21, 1.22, 1.22], plain=0.05)
    advice = advise(m)
    assert advice.best is None and not advice.p_min_may_pay
    assert max(advice.speedup.values()) < 1 and max(advice.bound.values()) < 1
    text = "\n".join(advice.lines())
    assert "do not speculate" in text and "no --spec-draft-p-min can make it pay" in text


def test_the_best_n_max_is_the_largest_expected_speedup():
    # a GPU-like cost curve: verify width nearly free, a cheap draft, acceptance rising with k
    m = _measurements([1.0, 1.02, 1.04, 1.06, 1.2, 1.5, 1.9, 2.4], [0.2] * 7, [1.6, 2.0, 2.3, 2.5, 2.6, 2.65, 2.7])
    advice = advise(m)
    expected = {k: m.expected[k] / (m.width_cost[k + 1] + 0.2) for k in range(1, 8)}
    assert advice.best == max(expected, key=expected.get) == 3
    assert advice.speedup == pytest.approx(expected)
    assert "--spec-draft-n-max 3" in "\n".join(advice.lines())


def test_a_cut_off_may_pay_where_the_whole_block_does_not():
    # wide verify passes are dear, the draft cheap: only shorter drafts (p-min) could pay
    m = _measurements([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [0.1] * 7, [1.5] * 7)
    advice = advise(m)
    assert advice.best is None and advice.p_min_may_pay == tuple(range(1, 8))
    assert "a --spec-draft-p-min cut-off could pay" in "\n".join(advice.lines())


def test_the_costs_are_counted_in_the_runs_own_plain_steps():
    """llama.cpp at Q4_1 on this CPU (2 threads): llama-bench's one-token pass read 13.8 ms where the
    speculative runs' plain step took 9.4 ms. Counted in llama-bench's T(1), the draft pass looked
    nearly free (D(1) = 0.11) and n-max 1 was advised at 1.07x, while it ran 0.71x; counted in the
    runs' own step, the prediction meets what the runs measured and the advice is plain decoding."""
    from dflash2.export.llama_cpp_advice import Timing, measurements_from

    def run(tok_s: float, ms: float, per_pass: float) -> Timing:
        return Timing(tok_s, ms / 1000, per_pass, 0, 0)
    timings = {"plain": run(106.3, 9.4, 1.0), "draft n-max 1": run(75.1, 18.8, 1.41),
               "draft n-max 2": run(62.2, 26.0, 1.62)}
    m = measurements_from({1: 0.0138, 2: 0.0172, 3: 0.0237}, timings, {1: 1.45, 2: 1.62}, "q4_1")
    advice = advise(m)
    assert m.width_cost[2] == pytest.approx(0.0172 / 0.0138) and m.plain_overhead == 0.0
    assert m.draft_cost[1] == pytest.approx(18.8 / 9.4 - 0.0172 / 0.0138)
    for k in (1, 2):
        assert advice.speedup[k] == pytest.approx(m.measured_speedup[k], abs=0.03)
    assert advice.best is None


def test_a_missing_cost_is_refused():
    with pytest.raises(ValueError, match="n-max 2"):
        advise(Measurements({1: 1.0, 2: 1.1}, {1: 0.1, 2: 0.1}, {1: 1.2, 2: 1.3}))


# ------------------------------------------------------------------ llama.cpp's driver
def test_the_wheels_missing_library_links_are_made(tmp_path):
    (tmp_path / "libllama.so.0.0.11434").write_bytes(b"")
    (tmp_path / "libggml-base.so.0.26.0").write_bytes(b"")
    (tmp_path / "_symlinks.json").write_text(json.dumps({"libllama.so.0": "libllama.so.0.0.11434",
                                                         "libllama.so": "libllama.so.0"}))
    llama_cpp.LlamaCpp(tmp_path).ensure_libraries()
    assert (tmp_path / "libllama.so").resolve() == (tmp_path / "libllama.so.0.0.11434").resolve()
    assert (tmp_path / "libggml-base.so.0").resolve() == (tmp_path / "libggml-base.so.0.26.0").resolve()
    assert (tmp_path / "libggml-base.so").resolve() == (tmp_path / "libggml-base.so.0.26.0").resolve()
    assert str(tmp_path) in llama_cpp.LlamaCpp(tmp_path).env()["LD_LIBRARY_PATH"].split(":")


def test_a_directory_without_llama_cpp_is_refused_and_absence_is_none(tmp_path, monkeypatch):
    with pytest.raises(Exception, match="has no llama-speculative-simple"):
        llama_cpp.find_llama_cpp(str(tmp_path))
    monkeypatch.delenv(llama_cpp.ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(llama_cpp, "PIP_BIN", Path("no-such-install"))
    assert llama_cpp.find_llama_cpp() is None


# ------------------------------------------------------------------ dflash2 acceptance
def test_profile_is_tau_and_the_share_of_cycles_reaching_each_position():
    result = acceptance.profile([[1, 3, 2], [8]], 7)
    assert result["tau"] == 14 / 4 and result["cycles"] == 4
    assert result["per_position"] == [3 / 4, 2 / 4, 1 / 4, 1 / 4, 1 / 4, 1 / 4, 1 / 4]
    assert acceptance.profile([], 3) == {"tau": None, "per_position": [None] * 3, "cycles": 0}


def test_acceptance_in_dflash2_at_two_precisions_with_absent_engines_skipped(tmp_path, smollm2_cache, capsys,
                                                                            monkeypatch):
    monkeypatch.setenv("DFLASH2_MLX_PYTHON", str(tmp_path / "no-mlx-python"))
    out = tmp_path / "acc.json"
    code = main(["acceptance", "--engines", "dflash2,mlx", "--dtypes", "float32,bfloat16", "--prompts", "2",
                 "--max-new-tokens", "12", "--threads", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(out.read_text())
    rows = {(r["engine"], r["precision"]): r for r in result["arms"]}
    assert set(rows) == {("dflash2", "float32"), ("dflash2", "bfloat16"), ("mlx", "float32"), ("mlx", "bfloat16")}
    assert rows["mlx", "float32"]["status"] == "skipped" and "setup_mlx.sh" in rows["mlx", "float32"]["reason"]
    for dtype in ("float32", "bfloat16"):
        row = rows["dflash2", dtype]
        assert row["status"] == "ok" and len(row["runs"]) == 2
        cycles = [c for run in row["runs"] for c in run["committed"]]
        assert row["tau"] == sum(cycles) / len(cycles) and row["cycles"] == len(cycles)
        assert all(1 <= c <= 8 for c in cycles) and 1 <= row["tau"] <= 8
        assert row["per_position"][0] == sum(c >= 2 for c in cycles) / len(cycles)
    assert "setup_mlx.sh" in printed and "| dflash2 | bfloat16 |" in printed
    code = main(["acceptance", "--engines", "dflash2", "--dtypes", "float32", "--out", str(out)])
    assert code == 2 and "--force" in capsys.readouterr().err


@needs_llama_cpp
def test_llama_cpp_on_the_same_weights_accepts_what_dflash2_accepts(tmp_path, smollm2_cache):
    """llama.cpp with the GGUF export and the f32 GGUF of the target: per-cycle acceptance and output
    equal to dflash2's in float32, prompt by prompt."""
    from dflash2.export.acceptance_cost import measurement_prompts
    from dflash2.pipeline import load_decoder

    pipe = load_decoder("smollm2", str(shipped_draft_path("smollm2")), dtype="float32", draft_dtype="float32",
                        proposer="draft")
    prompts = measurement_prompts(pipe.tokenizer, 2)
    job = arms.Job(shipped_draft_path("smollm2"), str(smollm2_cache[1]), BUILTIN_TARGETS["smollm2"].locate_gguf(tmp_path),
                   prompts, [pipe.tokenizer.decode(p) for p in prompts], 24, tuple(pipe.stop_token_ids), tmp_path)
    ours = arms.dflash2_arm(job, "float32")
    theirs = arms.llama_cpp_arm(job, LLAMA, "f32", 8, 1)
    assert theirs.status == "ok", theirs.reason
    assert not theirs.notes   # llama.cpp tokenizes each prompt as dflash2 does
    for mine, other in zip(ours.runs, theirs.runs):
        assert other["committed"] == mine["committed"]
        assert acceptance.same_text(other["text"], mine["tokens"], pipe.tokenizer)


# ------------------------------------------------------------------ dflash2 export --to gguf: the advice
def _no_llama_cpp_anywhere(monkeypatch, folder: Path) -> None:
    monkeypatch.delenv(llama_cpp.ENV, raising=False)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.chdir(folder)
    monkeypatch.setattr(llama_cpp, "PIP_BIN", Path("no-such-install"))


def test_gguf_export_says_how_to_get_llama_cpp_where_it_is_absent(tmp_path, capsys, monkeypatch):
    from dflash2.targets.tiny import tiny_draft, tiny_target

    draft = tiny_draft(tiny_target("llama"))
    draft.save_pretrained(tmp_path / "src")
    writer = GGUFWriter(str(tmp_path / "target.gguf"), "llama")   # the tokenizer the GGUF draft copies
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(draft.config.vocab_size)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _no_llama_cpp_anywhere(monkeypatch, tmp_path)
    code = main(["export", str(tmp_path / "src"), "--to", "gguf", "--out", str(tmp_path / "out"),
                 "--target", str(tmp_path / "target.gguf")])
    printed = capsys.readouterr().out
    assert code == 0 and (tmp_path / "out" / "draft.gguf").is_file()
    assert "not measured" in printed and "install_llama_cpp.sh" in printed and llama_cpp.ENV in printed
    code = main(["export", str(tmp_path / "src"), "--to", "gguf", "--out", str(tmp_path / "out2"), "--no-advice",
                 "--target", str(tmp_path / "target.gguf")])
    assert code == 0 and "llama.cpp" not in capsys.readouterr().out.split("serve it:")[0]
    # llama.cpp found, but the target's GGUF holds only its tokenizer: the export is written, the advice
    # says why it is not measured (it used to convert that GGUF into a default-sized 7B model)
    monkeypatch.setattr(llama_cpp, "find_llama_cpp", lambda explicit=None: llama_cpp.LlamaCpp(tmp_path))
    code = main(["export", str(tmp_path / "src"), "--to", "gguf", "--out", str(tmp_path / "out3"),
                 "--target", str(tmp_path / "target.gguf")])
    printed = capsys.readouterr().out
    assert code == 0 and (tmp_path / "out3" / "draft.gguf").is_file()
    assert "not measured" in printed and "holds no model weights" in printed


@needs_llama_cpp
def test_gguf_export_prints_the_advice_measured_in_llama_cpp(tmp_path, smollm2_cache, capsys):
    code = main(["export", str(shipped_draft_path("smollm2")), "--to", "gguf", "--out", str(tmp_path / "out"),
                 "--dtype", "float32", "--measure-prompts", "1", "--measure-tokens", "12"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("speculation advice (llama.cpp"))
    table = {line.split()[0]: line for line in lines[start + 1:start + 8]}
    assert lines[start + 2].split() == ["n-max", "k", *map(str, range(1, 8))]   # k = 1..7
    assert "measured" in table and "speedup" in table
    verdict = "\n".join(lines[start:])
    assert ("--spec-draft-n-max" in verdict and "expected" in verdict) or "do not speculate" in verdict
    assert "vLLM num_speculative_tokens" in verdict
