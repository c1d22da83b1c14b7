"""`dflash2 export`: each form reloads with the right names, shapes, metadata and values; a draft
missing a DFlash2 part gets it in its neutral form and decodes the same tokens; refusals are one
line, exit 2, before anything slow."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from dflash2.cli import main
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.export import ExportSettings, export_draft
from dflash2.export import gguf_format
from dflash2.export.neutral import NEUTRAL_SELECTOR_RANK, full_vocabulary
from dflash2.model.draft import DFlash2DraftModel
from dflash2.pipeline import Pipeline, shipped_draft_path
from dflash2.targets.builtin import BUILTIN_TARGETS
from dflash2.targets.tiny import tiny_draft, tiny_target

COMPLETE_KEYS = {"hidden_act": "silu", "attention_bias": False, "is_causal": False, "model_type": "qwen3",
                 "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


def save(draft: DFlash2DraftModel, path: Path) -> Path:
    draft.save_pretrained(path)
    return path


def export(src: Path, form: str, out: Path, **kw):
    return export_draft(ExportSettings(draft=src, form=form, out=out, measure_prompts=0, **kw))


def greedy_tokens(target, draft, temperature: float = 0.0) -> list[list[int]]:
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, "always")
    prompts = [[1, 5, 9, 17, 33, 60], [1, 7, 7, 7, 21, 44, 90, 3, 12]]
    config = GenerationConfig(max_new_tokens=24, temperature=temperature, seed=3)
    return [r.tokens for r in decoder.generate(prompts, config)]


# ------------------------------------------------------------------ dflash2 form
def test_dflash2_form_reloads_with_complete_engine_config(tmp_path, target):
    src = save(tiny_draft(target), tmp_path / "src")
    result = export(src, "dflash2", tmp_path / "out")
    assert result.files == [tmp_path / "out" / "config.json", tmp_path / "out" / "model.safetensors"]
    assert not result.completed and not result.dropped
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    for key, value in COMPLETE_KEYS.items():
        assert config[key] == value, key
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": config["rope_theta"]}
    assert config["dtype"] == "float32" and config["sliding_window"] == 64 and config["use_sliding_window"]
    assert config["layer_types"] == ["sliding_attention"] * 2 and config["max_window_layers"] == 0
    assert "use_conv" not in config["dflash_config"] and "use_selector" not in config["dflash_config"]
    original, reloaded = DFlash2DraftModel.from_pretrained(src), DFlash2DraftModel.from_pretrained(tmp_path / "out")
    assert reloaded.config.is_dflash2 and reloaded.config.use_conv and reloaded.config.use_selector
    a, b = original.state_dict(), reloaded.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_dflash2_form_keeps_the_stored_dtype_unless_asked(tmp_path, target):
    src = save(tiny_draft(target).to(torch.bfloat16), tmp_path / "src")
    export(src, "dflash2", tmp_path / "auto")
    export(src, "dflash2", tmp_path / "f32", dtype="float32")
    from safetensors import safe_open
    for name, want in (("auto", torch.bfloat16), ("f32", torch.float32)):
        with safe_open(str(tmp_path / name / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {want}
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize("missing", ["conv", "selector"])
def test_missing_part_gets_its_neutral_form_and_the_same_tokens(tmp_path, target, missing):
    arm = tiny_draft(target, use_conv=missing != "conv", use_selector=missing != "selector")
    src = save(arm, tmp_path / "src")
    result = export(src, "dflash2", tmp_path / "out")
    assert len(result.completed) == 1 and missing[:4] in result.completed[0]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert "use_conv" not in config["dflash_config"] and "use_selector" not in config["dflash_config"]
    reloaded = DFlash2DraftModel.from_pretrained(tmp_path / "out")
    assert reloaded.config.use_conv and reloaded.config.use_selector
    if missing == "conv":
        for layer in reloaded.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                assert torch.all(conv.base_kernel[:, 0] == 1) and torch.all(conv.base_kernel[:, 1] == 0)
                assert torch.all(conv.kernel_projection.weight == 0)
    else:
        assert config["dflash_config"]["selector_rank"] == NEUTRAL_SELECTOR_RANK
        assert torch.all(reloaded.candidate_selector.successor_codebook == 0)
    original = DFlash2DraftModel.from_pretrained(src)
    ours, theirs = greedy_tokens(target, original), greedy_tokens(target, reloaded)
    assert ours == theirs
    # the proposals are the same too, not only the (lossless) output: same acceptance per cycle
    dec_a = SpeculativeDecoder(TargetAdapter(target, original.config.target_layer_ids), original, "always")
    dec_b = SpeculativeDecoder(TargetAdapter(target, reloaded.config.target_layer_ids), reloaded, "always")
    cfg = GenerationConfig(max_new_tokens=24)
    cycles_a = [r.stats.committed_per_cycle for r in dec_a.generate([[1, 5, 9, 17]], cfg)]
    cycles_b = [r.stats.committed_per_cycle for r in dec_b.generate([[1, 5, 9, 17]], cfg)]
    assert cycles_a == cycles_b
    if missing == "conv":  # identity convolutions are exact under sampling too (same draws)
        assert greedy_tokens(target, original, 1.0) == greedy_tokens(target, reloaded, 1.0)


def test_v1_draft_is_refused_as_dflash2_with_the_right_form(tmp_path, target, capsys):
    src = save(tiny_draft(target, use_conv=False, use_selector=False), tmp_path / "src")
    code = main(["export", str(src), "--to", "dflash2", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "--to dflash-v1" in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ dflash-v1 form
def test_dflash_v1_form_drops_the_parts_and_reloads_as_v1(tmp_path, target):
    src = save(tiny_draft(target), tmp_path / "src")
    result = export(src, "dflash-v1", tmp_path / "out")
    assert result.architecture == "DFlashDraftModel" and result.dropped == ["convolutions", "selector"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["is_causal"] is False
    assert not {"conv_kernel_size", "selector_rank", "use_conv", "use_selector"} & set(config["dflash_config"])
    v1 = DFlash2DraftModel.from_pretrained(tmp_path / "out")
    assert not v1.config.is_dflash2
    names = set(v1.state_dict())
    assert not any("conv" in n or "selector" in n for n in names)
    full = DFlash2DraftModel.from_pretrained(src).state_dict()
    assert all(torch.equal(full[n], t) for n, t in v1.state_dict().items())


class _Tokenizer:
    """Enough of a tokenizer for the measurement prompts on a tiny target (ids < its vocab)."""
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [3 + (ord(c) % 100) for c in text[:40]]}

    def encode(self, text, add_special_tokens=True):
        return self(text)["input_ids"]


def test_dflash_v1_measures_its_cost_with_the_reloaded_export(tmp_path, target):
    draft = tiny_draft(target)
    src = save(draft, tmp_path / "src")
    pipe = Pipeline(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), _Tokenizer(),
                    (), "tiny", False)
    settings = ExportSettings(draft=src, form="dflash-v1", out=tmp_path / "out", measure_prompts=3, measure_tokens=12)
    result = export_draft(settings, pipeline=pipe)
    cost = result.cost
    assert cost is not None and cost.prompts == 3 and cost.new_tokens_per_prompt == 12
    assert 1.0 <= cost.exported_acceptance_length <= 8 and 1.0 <= cost.original_acceptance_length <= 8
    assert cost.identical_outputs  # greedy: both are the target's own output
    assert "acceptance length" in cost.line() and "identical: True" in cost.line()


def test_reduced_vocabulary_draft_exports_scoring_the_whole_vocabulary(tmp_path, target, capsys):
    """Engines score all rows: the export drops a draft vocabulary on its own and says so."""
    src = save(tiny_draft(target, draft_vocab_size=40), tmp_path / "src")
    assert main(["export", str(src), "--to", "dflash2", "--out", str(tmp_path / "out"), "--measure-prompts", "0"]) == 0
    assert "removed: draft vocabulary (40 tokens)" in capsys.readouterr().out
    assert "draft_vocab_size" not in json.loads((tmp_path / "out" / "config.json").read_text())["dflash_config"]


@pytest.mark.parametrize("form", ["dflash2", "dflash-v1"])
def test_full_vocabulary_export_drops_the_mapping_and_measures_its_cost(tmp_path, target, form):
    """Engines score the whole vocabulary: the export has no d2t / t2d and no draft_vocab_size, keeps
    every other weight, decodes the target's own tokens, and its acceptance cost is measured."""
    draft = tiny_draft(target, draft_vocab_size=40)
    src = save(draft, tmp_path / "src")
    pipe = Pipeline(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), _Tokenizer(),
                    (), "tiny", False)
    settings = ExportSettings(draft=src, form=form, out=tmp_path / "out", measure_prompts=2,
                              measure_tokens=10)
    result = export_draft(settings, pipeline=pipe)
    assert result.dropped[0] == "draft vocabulary (40 tokens)"
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "draft_vocab_size" not in config["dflash_config"]
    exported = DFlash2DraftModel.from_pretrained(tmp_path / "out")
    assert not hasattr(exported, "d2t") and exported.config.draft_vocab_size is None
    assert torch.equal(exported.fc.weight, DFlash2DraftModel.from_pretrained(src).fc.weight)
    assert result.cost is not None and result.cost.identical_outputs
    assert greedy_tokens(target, exported) == greedy_tokens(target, DFlash2DraftModel.from_pretrained(src))


# ------------------------------------------------------------------ gguf form
def _tokenizer_gguf(path: Path, n_tokens: int) -> Path:
    writer = GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(n_tokens)])
    writer.add_array("tokenizer.ggml.token_type", [1] * n_tokens)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _fields(reader: GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


def test_gguf_form_names_shapes_types_and_metadata(tmp_path, target):
    draft = tiny_draft(target)
    src = save(draft, tmp_path / "src")
    vocab = _tokenizer_gguf(tmp_path / "target.gguf", draft.config.vocab_size)
    result = export(src, "gguf", tmp_path / "out", target=str(vocab), dtype="float16")
    reader = GGUFReader(str(tmp_path / "out" / "draft.gguf"))
    tensors = {t.name: t for t in reader.tensors}
    state = draft.state_dict()
    assert result.tensors == len(state) == len(tensors)
    for name, tensor in state.items():
        gname = gguf_format.gguf_name(name)
        got = tensors[gname]
        assert tuple(int(d) for d in got.shape) == tuple(reversed(tensor.shape)), gname  # ggml order
        expect_f32 = tensor.dim() == 1 or gname.endswith("_norm.weight") or not gname.endswith(".weight")
        assert got.tensor_type == (GGMLQuantizationType.F32 if expect_f32 else GGMLQuantizationType.F16), gname
        values = np.asarray(got.data).reshape(tuple(tensor.shape)).astype(np.float32)
        want = tensor.float().numpy() if expect_f32 else tensor.half().float().numpy()
        assert np.array_equal(values, want), gname
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight", "blk.0.attn_conv_base",
            "blk.1.ffn_conv_proj.weight", "selector_predecessor.weight", "selector_hidden.weight"} <= set(tensors)
    fields = _fields(reader)
    c = draft.config
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.target_layers"] == [i + 1 for i in c.target_layer_ids]  # llama.cpp taps layer inputs
    assert fields["dflash.attention.causal"] is False and fields["dflash.block_size"] == c.block_size
    assert fields["dflash.selector_rank"] == c.selector_rank and fields["dflash.selector_top_k"] == c.selector_top_k
    assert fields["dflash.conv_kernel_size"] == 2 and fields["dflash.conv_group_size"] == c.conv_group_size
    assert fields["dflash.attention.sliding_window"] == 64
    assert fields["dflash.attention.sliding_window_pattern"] == [True, True]
    assert fields["dflash.embedding_length"] == c.hidden_size and fields["dflash.block_count"] == 2
    assert fields["general.file_type"] == 1  # MOSTLY_F16
    assert fields["tokenizer.ggml.mask_token_id"] == c.mask_token_id
    assert len(fields["tokenizer.ggml.tokens"]) == c.vocab_size and fields["tokenizer.ggml.model"] == "gpt2"
    types = {name: f.types for name, f in reader.fields.items()}
    assert types["dflash.target_layers"] == [GGUFValueType.ARRAY, GGUFValueType.INT32]


def test_gguf_of_a_v1_draft_has_no_dflash2_parts(tmp_path, target):
    draft = tiny_draft(target, use_conv=False, use_selector=False)
    src = save(draft, tmp_path / "src")
    vocab = _tokenizer_gguf(tmp_path / "target.gguf", draft.config.vocab_size)
    export(src, "gguf", tmp_path / "out", target=str(vocab))
    reader = GGUFReader(str(tmp_path / "out" / "draft.gguf"))
    assert not any("conv" in t.name or "selector" in t.name for t in reader.tensors)
    assert "dflash.selector_rank" not in reader.fields
    assert reader.fields["general.name"].contents() == "DFlash draft"


def test_gguf_of_the_shipped_draft_against_the_builtin_target(tmp_path):
    src = shipped_draft_path("smollm2")
    result = export(src, "gguf", tmp_path / "out")
    assert result.dtype == "bfloat16"
    reader = GGUFReader(str(tmp_path / "out" / "draft.gguf"))
    fields = _fields(reader)
    target_gguf = GGUFReader(str(BUILTIN_TARGETS["smollm2"].locate_gguf(tmp_path)))
    for name, field in target_gguf.fields.items():  # llama.cpp compares the draft's vocab to the target's
        if name.startswith("tokenizer."):
            assert fields[name] == field.contents(), name
    assert fields["tokenizer.ggml.mask_token_id"] == 16 and fields["dflash.target_layers"] == [2, 15, 28]
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["fc.weight"] == GGMLQuantizationType.BF16 and types["blk.0.attn_conv_base"] == GGMLQuantizationType.F32
    draft = full_vocabulary(DFlash2DraftModel.from_pretrained(src, dtype=torch.bfloat16))   # engines score all rows
    tensors = {t.name: t for t in reader.tensors}
    for name, tensor in draft.state_dict().items():  # shapes in ggml order; bf16 values bit-exact
        got = tensors[gguf_format.gguf_name(name)]
        assert tuple(int(d) for d in got.shape) == tuple(reversed(tensor.shape)), name
        raw = np.asarray(got.data)
        if got.tensor_type == GGMLQuantizationType.BF16:
            bits = torch.from_numpy(raw.view(np.int16).reshape(tuple(tensor.shape)).copy())
            assert torch.equal(bits.view(torch.bfloat16), tensor), name
        else:
            assert np.array_equal(raw.reshape(tuple(tensor.shape)), tensor.float().numpy()), name


def test_gguf_refuses_a_tokenizer_of_another_vocab(tmp_path, target):
    src = save(tiny_draft(target), tmp_path / "src")
    vocab = _tokenizer_gguf(tmp_path / "other.gguf", 100)
    with pytest.raises(Exception, match="not the draft's target"):
        export(src, "gguf", tmp_path / "out", target=str(vocab))
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ refusals (CLI)
@pytest.mark.parametrize("args, words", [
    (["--to", "onnx"], "invalid choice"),
    (["--to", "gguf", "--target", "some/hf-dir"], "--target FILE.gguf"),
    (["--to", "dflash2", "--dtype", "int8"], "invalid choice"),
    (["--to", "dflash-v1", "--measure-prompts", "-1"], "--measure-prompts"),
])
def test_bad_arguments_are_one_line_before_anything_loads(tmp_path, target, capsys, monkeypatch, args, words):
    src = save(tiny_draft(target), tmp_path / "src")
    monkeypatch.setattr(DFlash2DraftModel, "from_pretrained", lambda *a, **k: pytest.fail("loaded weights"))
    code = main(["export", str(src), "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 0 and words in err, err


def test_missing_draft_is_one_line(tmp_path, capsys):
    code = main(["export", str(tmp_path / "nope"), "--to", "dflash2", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "nope" in err


def test_nothing_a_user_made_is_overwritten(tmp_path, target, capsys):
    src = save(tiny_draft(target), tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    code = main(["export", str(src), "--to", "dflash2", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--force" in err and err.count("\n") == 0
    assert (out / "mine.txt").read_text() == "keep me"
    # the draft's own directory (or one holding it) is refused even with --force
    code = main(["export", str(src), "--to", "dflash2", "--out", str(tmp_path), "--force"])
    assert code == 2 and "holds the draft" in capsys.readouterr().err
    assert main(["export", str(src), "--to", "dflash2", "--out", str(out), "--force"]) == 0
    # --force replaces the export's own files only: the user's file stays
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "mine.txt", "model.safetensors"]
    assert (out / "mine.txt").read_text() == "keep me"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the atomic swap left no temporary directory behind


def test_a_failed_export_leaves_the_old_output_untouched(tmp_path, target, monkeypatch):
    src = save(tiny_draft(target), tmp_path / "src")
    out = tmp_path / "out"
    export(src, "dflash2", out)
    before = (out / "model.safetensors").read_bytes()
    from dflash2.export import exporter

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(exporter, "write_checkpoint", boom)
    with pytest.raises(RuntimeError):
        export(src, "dflash-v1", out, force=True)
    assert (out / "model.safetensors").read_bytes() == before
