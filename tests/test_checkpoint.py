"""Checkpoint format (SPEC §2.1–2.2): round trip, tensor names and shapes, DFlash v1 loading."""
from __future__ import annotations

import json

import pytest
import torch

from dflash2.model.config import DFlash2Config, default_target_layer_ids
from dflash2.model.draft import DFlash2DraftModel
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets.tiny import tiny_draft

QWEN38_27B_DRAFT = {
    "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False,
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 5, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 248320, "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0, "max_position_embeddings": 262144,
    "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048, "use_sliding_window": True, "num_target_layers": 64,
    "tie_word_embeddings": False,
    "dflash_config": {"block_size": 8, "mask_token_id": 248070, "target_layer_ids": [5, 19, 33, 47, 61],
                      "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16},
}


def expected_shapes(h, inter, layers, heads, kv, d, vocab, taps, ht, r, k=2, group=16):
    g = h // group
    shapes = {"fc.weight": (h, taps * ht), "hidden_norm.weight": (h,), "norm.weight": (h,),
              "candidate_selector.predecessor_codebook": (vocab, r),
              "candidate_selector.successor_codebook": (vocab, r),
              "candidate_selector.hidden_projection.weight": (r, h)}
    for i in range(layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (heads * d, h), p + "self_attn.k_proj.weight": (kv * d, h),
            p + "self_attn.v_proj.weight": (kv * d, h), p + "self_attn.o_proj.weight": (h, heads * d),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
        for conv in ("attention_conv", "mlp_conv"):
            shapes[p + f"{conv}.base_kernel"] = (2, k, h)
            shapes[p + f"{conv}.kernel_projection.weight"] = (2 * k * g, h)
    return shapes


def test_published_27b_draft_layout_on_meta_device():
    config = DFlash2Config.from_dict(QWEN38_27B_DRAFT)
    with torch.device("meta"):
        model = DFlash2DraftModel(config)
    got = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert got == expected_shapes(5120, 17408, 5, 32, 8, 128, 248320, 5, 5120, 256)
    # SPEC: 1.92 B parameters
    assert abs(model.num_parameters() / 1e9 - 1.92) < 0.01
    assert config.to_dict() == QWEN38_27B_DRAFT


def test_save_load_round_trip_and_same_output(tmp_path, tiny_models):
    target, draft = tiny_models["llama"]
    draft.save_pretrained(tmp_path / "d")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", "model.safetensors"]
    loaded = DFlash2DraftModel.from_pretrained(tmp_path / "d")
    for (n1, t1), (n2, t2) in zip(draft.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2)
    prompts = [[5, 6, 7, 8], [9, 10]]
    config = GenerationConfig(max_new_tokens=12)
    a = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, "always").generate(prompts, config)
    b = SpeculativeDecoder(TargetAdapter(target, loaded.config.target_layer_ids), loaded, "always").generate(prompts, config)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.stats.committed_per_cycle for r in a] == [r.stats.committed_per_cycle for r in b]


def test_dflash_v1_checkpoint_loads_without_conv_and_selector(tmp_path, tiny_models):
    target, _ = tiny_models["qwen3"]
    v1 = tiny_draft(target, use_conv=False, use_selector=False)
    v1.save_pretrained(tmp_path / "v1")
    config = json.loads((tmp_path / "v1" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert "selector_rank" not in config["dflash_config"]
    loaded = DFlash2DraftModel.from_pretrained(tmp_path / "v1")
    assert loaded.selector is None and not loaded.config.use_conv
    assert not any("conv" in n or "selector" in n for n in loaded.state_dict())


def test_fresh_dflash2_equals_dflash_v1(tiny_models):
    """Identity conv init + neutral selector: a fresh DFlash2 drafts exactly like DFlash v1."""
    target, _ = tiny_models["gemma3"]
    v2 = tiny_draft(target, seed=7)
    for module in v2.modules():
        if hasattr(module, "reset_parameters") and type(module).__name__ in ("GroupedDynamicConv", "CandidateSelector"):
            module.reset_parameters()
    v1 = tiny_draft(target, use_conv=False, use_selector=False, seed=7)
    v1.load_state_dict({n: t for n, t in v2.state_dict().items() if "conv" not in n and "selector" not in n})
    prompts = [[4, 5, 6, 7, 8, 9]]
    config = GenerationConfig(max_new_tokens=16, block_size=8)
    runs = [SpeculativeDecoder(TargetAdapter(target, d.config.target_layer_ids), d, "always").generate(prompts, config)[0]
            for d in (v1, v2)]
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].stats.committed_per_cycle == runs[1].stats.committed_per_cycle


def test_default_target_layer_rule():
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert default_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]
    ids = default_target_layer_ids(18, 3)
    assert ids[0] == 1 and ids[-1] == 15


def test_save_is_atomic_when_writing_fails(tmp_path, tiny_models, monkeypatch):
    target, draft = tiny_models["llama"]
    draft.save_pretrained(tmp_path / "d")
    before = (tmp_path / "d" / "model.safetensors").read_bytes()
    import dflash2.files.weights as weight_files

    def failing_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(weight_files, "save_file", failing_save)
    for path in (tmp_path / "d", tmp_path / "new"):  # into an existing directory, and a new one
        with pytest.raises(OSError):
            draft.save_pretrained(path)
    assert (tmp_path / "d" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", "model.safetensors"]


def test_draft_dtype_auto_rules(monkeypatch):
    """`--draft-dtype auto`: the target's dtype on CUDA and on CPUs without native bf16, bf16 on
    CPUs with it; an explicit name always wins."""
    from dflash2 import pipeline as loading

    monkeypatch.setattr(loading, "native_bfloat16", lambda device: (False, "test: no bf16"))
    assert loading.draft_dtype_for("auto", "cpu", torch.float32) == torch.float32
    assert loading.draft_dtype_for("auto", "cuda", torch.float32) == torch.float32
    assert loading.draft_dtype_for("auto", "cuda:0", torch.bfloat16) == torch.bfloat16
    monkeypatch.setattr(loading, "native_bfloat16", lambda device: (device == "cpu", "test: bf16 on the CPU"))
    assert loading.draft_dtype_for("auto", "cpu", torch.float32) == torch.bfloat16
    assert loading.draft_dtype_for("auto", "cuda", torch.float32) == torch.float32
    assert loading.draft_dtype_for("fp32", "cpu", torch.bfloat16) == torch.float32
