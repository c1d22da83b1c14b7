"""The built-in Llama's fused / packed projections (`model.projections`) compute what the separate
linear layers compute: the same bits where the contract says so (every pass at bfloat16, the
one-row step at float32 unless oneDNN's layout is row-invariant there), rounding only elsewhere;
where it is, every float32 pass gives each row its one-row bits; the parts keep their names and storage; casts,
reloads and gradients still reach them."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dflash2.runtime.devices import cpu_flags
from dflash2.model import projections
from dflash2.targets import llama
from dflash2.model.projections import FUSED, PACKED, PARTS, Projection, kernel

# the built-in target's projections (SmolLM2-135M): Q/K/V, gate/up, down, and an LM head's width
SHAPES = {"qkv": (576, [576, 192, 192]), "gate_up": (576, [1536, 1536]), "down": (1536, [576]),
          "head": (576, [8192])}


def _parts(inputs: int, outputs: list[int], dtype: torch.dtype, seed: int) -> list[nn.Linear]:
    torch.manual_seed(seed)
    parts = [nn.Linear(inputs, n, bias=False) for n in outputs]
    for part in parts:
        part.weight.data = (torch.randn(n := part.out_features, inputs) * 0.05).to(dtype)
        assert n == part.weight.shape[0]
    return parts


def _reference(parts: list[nn.Linear], x: torch.Tensor) -> torch.Tensor:
    return torch.cat([F.linear(x, p.weight) for p in parts], dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_projection_is_its_parts(name, dtype):
    """Bits equal to the separate `F.linear`s for the plain step (one row), for prefill-sized passes
    and, packed at bfloat16, up to `SAME_BITS_ROWS` rows; rounding only for the rest."""
    inputs, outputs = SHAPES[name]
    parts = _parts(inputs, outputs, dtype, seed=len(name))
    projection = Projection(*parts)
    projection.refresh("packed")
    packed_bf16 = dtype == torch.bfloat16 and projection.packed is not None
    invariant_f32 = dtype == torch.float32 and projection.invariant      # packed for one row too
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in (1, 2, 8, 24, 32, 33, 64, 128, 129, 300):
            x = torch.randn(1, rows, inputs, generator=generator).to(dtype)
            ours, reference = projection(x), _reference(parts, x)
            choice = kernel(rows, dtype, projection.packed is not None, projection.invariant)
            if (rows == 1 and not invariant_f32) or choice == PARTS or (packed_bf16 and rows <= projections.SAME_BITS_ROWS):
                assert torch.equal(ours, reference), (rows, choice)
            else:
                scale = reference.abs().max().item()
                torch.testing.assert_close(ours, reference, rtol=0, atol=2e-5 * scale if dtype == torch.float32
                                           else 1e-2 * scale)
            # row-invariant on AMX (a verify pass's rows are one-row steps); an AMD EPYC without AMX
            # rounds the 1536-wide down projection's rows otherwise among 24 (oneDNN's avx512 kernel)
            # float32 packed where the probe found it row-invariant: every pass of up to FUSED_ROWS rows
            if choice == PACKED and ((packed_bf16 and "amx_bf16" in cpu_flags()) or invariant_f32):
                one_by_one = torch.cat([projection(x[:, i:i + 1]) for i in range(rows)], dim=1)
                assert torch.equal(ours, one_by_one), rows


def test_the_row_invariance_probe_sees_a_kernel_that_rounds_by_row_count(monkeypatch):
    """A packed kernel whose rows round otherwise among others must keep the float32 one-row step on
    `F.linear` (transformers' bits); the probe is not blind."""
    if not projections.can_pack(torch.zeros(1, 1)):
        pytest.skip("no oneDNN packing on this build")
    exact = projections.packed_product

    def rounds_by_row_count(x, packed):
        out = exact(x, packed)
        return out if x.shape[0] == 1 else out + out.abs() * 2 ** -22     # one ulp-ish off among others
    monkeypatch.setattr(projections, "_INVARIANT", {})
    monkeypatch.setattr(projections, "packed_product", rounds_by_row_count)
    parts = _parts(*SHAPES["down"], torch.float32, seed=1)
    projection = Projection(*parts)
    projection.refresh("packed")
    assert projection.packed is not None and not projection.invariant
    x = torch.randn(1, 1, 1536)
    assert torch.equal(projection(x), _reference(parts, x))          # the one-row step stays MKL's
    monkeypatch.setattr(projections, "_INVARIANT", {})
    monkeypatch.setattr(projections, "packed_product", exact)
    projection.refresh("packed")
    assert projection.invariant == projections.row_invariant(projection.packed, (576, 1536), torch.float32)


def test_the_kernel_choice():
    assert kernel(1, torch.float32, True) == FUSED            # float32, packed layout not row-invariant: MKL
    assert kernel(1, torch.float32, True, invariant=True) == PACKED    # row-invariant: the verify pass's kernel
    assert kernel(1, torch.float32, False, invariant=True) == FUSED
    assert kernel(8, torch.float32, True) == PACKED
    assert kernel(1, torch.bfloat16, True) == PACKED
    assert kernel(8, torch.bfloat16, False) == FUSED          # nothing packed (CUDA, no oneDNN)
    assert kernel(projections.FUSED_ROWS + 1, torch.bfloat16, True) == PARTS   # prefills
    assert kernel(projections.FUSED_ROWS, torch.bfloat16, True) == PACKED
    meta = torch.empty(4, 4, device="meta")
    assert not projections.can_pack(meta)                       # CPU only


def _tiny(dtype=torch.float32) -> llama.LlamaCausalLM:
    config = llama.LlamaTargetConfig(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=True,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = llama.LlamaCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model.to(dtype).eval()    # the cast refreshes the projections (the values changed in place)


def test_parts_are_views_of_the_fused_weight():
    model = _tiny()
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    fused = attention.qkv.weight
    assert attention.q_proj.weight.data_ptr() == fused.data_ptr()
    assert attention.k_proj.weight.data_ptr() == fused[attention.q_proj.out_features:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up.weight[mlp.gate_proj.out_features:].data_ptr()
    assert "model.layers.0.self_attn.q_proj.weight" in model.state_dict()
    assert not any("qkv" in name or "gate_up" in name for name in model.state_dict())


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_casts_and_reloads_reach_the_fused_weights():
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    model = _tiny()
    reference = _logits(model, ids)
    # a weight changed through load_state_dict (assign or copy) changes what the fused call computes
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    state["model.layers.1.self_attn.v_proj.weight"] *= 2
    state["model.layers.0.mlp.up_proj.weight"] *= -1
    for assign in (True, False):
        changed = _tiny()
        changed.load_state_dict(state, assign=assign)
        fresh = _logits(changed, ids)
        assert (fresh - reference).abs().max() > 1e-2, assign
        loaded = _tiny()
        loaded.load_state_dict(state)
        assert torch.equal(fresh, _logits(loaded, ids))
    # after a cast the fused (and packed) weights are the cast parts': what a model loaded with them computes
    model.to(torch.bfloat16).float()
    loaded = _tiny()
    loaded.load_state_dict(model.state_dict())
    loaded.model.rotary_emb.inv_freq.copy_(model.model.rotary_emb.inv_freq)   # a buffer the cast rounded too
    rounded = _logits(model, ids)
    assert (rounded - reference).abs().max() > 0                      # the bfloat16 round trip shows
    assert torch.equal(rounded, _logits(loaded, ids))
    model.to(torch.bfloat16)
    assert model.model.layers[0].self_attn.qkv.weight.dtype == torch.bfloat16


def test_packing_changes_no_bit_of_a_step():
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    for dtype in (torch.float32, torch.bfloat16):
        packed, plain = _tiny(dtype), _tiny(dtype)
        projections.set_weights(plain, "plain")
        assert all(p.packed is None for m in plain.modules() if isinstance(m, projections.Fusing)
                   for p in m.projections())
        one_row_packed = any(p.invariant for m in packed.modules() if isinstance(m, projections.Fusing)
                             for p in m.projections())
        if one_row_packed:                # float32 where oneDNN's layout is row-invariant: rounding only
            torch.testing.assert_close(_logits(packed, ids[:, :1]), _logits(plain, ids[:, :1]), rtol=0, atol=1e-5)
        else:
            assert torch.equal(_logits(packed, ids[:, :1]), _logits(plain, ids[:, :1]))   # one row
        if dtype == torch.bfloat16:
            assert torch.equal(_logits(packed, ids), _logits(plain, ids))


def test_gradients_reach_the_parts():
    model = _tiny()
    model.requires_grad_(True)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    attention = model.model.layers[0].self_attn
    for part in (attention.q_proj, attention.k_proj, attention.v_proj, model.model.layers[1].mlp.gate_proj):
        assert part.weight.grad is not None and part.weight.grad.abs().sum() > 0


def test_stepbench_times_both_variants_and_compares_their_logits(smollm2_cache, tmp_path, capsys):
    """`python -m dflash2.tools.profile.stepbench`: a row per dtype and pass size, the packed and
    plain forms' logits bit for bit equal at bfloat16 (the contract of `model.projections`)."""
    from dflash2.tools.profile import stepbench

    out = tmp_path / "steps.json"
    assert stepbench.main(["--dtype", "bfloat16", "--tokens", "1,3", "--repeats", "2", "--context", "20",
                           "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| bfloat16 | 3 |" in printed
    rows = json.loads(out.read_text())
    assert [r["tokens"] for r in rows] == [1, 3]
    for row in rows:
        assert row["same_logits"] == {"packed": True, "plain": True}
        assert row["ms"]["packed"] > 0 and row["ms"]["plain"] > 0
        assert row["op_ms"]["matmul"] > 0 and row["ops_per_pass"] > 0
        # 134.5 M parameters in bfloat16, the tied LM head read once (twice: 0.33 GB; not at all: 0.21 GB)
        assert 0.26 < row["weight_gb"] < 0.28
    assert "This machine reads" in printed and "weights GB/s" in printed
    assert stepbench.main(["--dtype", "float16"]) == 2
    assert capsys.readouterr().err.startswith("error: --dtype")


def test_autocast_runs_the_parts_as_before():
    """Training extracts features under CPU autocast (bfloat16 activations, float32 weights): the
    projections then take F.linear per part, as transformers' own modules would."""
    model = _tiny(torch.float32)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _logits(model, ids)
        projections.set_weights(model, "plain")
        want = _logits(model, ids)
    assert torch.equal(got, want)
