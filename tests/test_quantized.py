"""Weight-only int8 / int4 projections (model.quantized): the kernels multiply by the weight
`dequantize` describes, grids are recovered, unsupported weights are refused in one line, and a
model's layers (never its LM head) take the quantized form."""
import pytest
import torch

from dflash2.errors import DFlash2Error
from dflash2.model import projections, quantized
from tests.test_projections import _logits, _tiny


def _weight(out=64, inputs=96, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(out, inputs, generator=generator) * 0.05).to(torch.bfloat16)


@pytest.mark.parametrize("scheme", quantized.SCHEMES)
def test_the_kernel_multiplies_by_the_dequantized_weight(scheme):
    weight = _weight()
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    reference = x.float() @ quantized.dequantize(weight, scheme).t()
    got = quantized.matmul(x, quantized.quantize(weight, scheme)).float()
    assert got.shape == (5, 64)
    assert torch.allclose(got, reference, atol=2e-2, rtol=2e-2)
    # and the dequantized weight is the float weight up to half a quantization step
    w = weight.float()
    if scheme == "int8":
        step = w.abs().amax(dim=1, keepdim=True) / 127                                     # [out, 1]
    else:
        groups = w.view(64, -1, quantized.INT4_GROUP)                                      # [out, in/g, g]
        step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(quantized.INT4_GROUP, dim=1)
    rounding = (w.abs() + 16 * step) * 2 ** -8            # scale and zero (~ |w| + 8 steps) stored in bfloat16
    assert ((quantized.dequantize(weight, scheme) - w).abs() <= 0.5 * step + 2 * rounding).all()


def test_a_weight_on_a_q4_1_grid_comes_back():
    generator = torch.Generator().manual_seed(2)
    out, inputs = 32, 64
    groups = inputs // quantized.INT4_GROUP
    low = torch.randn(out, groups, 1, generator=generator) * 0.05
    scale = torch.rand(out, groups, 1, generator=generator) * 0.01 + 0.001
    q = torch.randint(0, 16, (out, groups, quantized.INT4_GROUP), generator=generator).float()
    q[..., 0], q[..., 1] = 0, 15                          # every group spans the whole grid
    weight = (low + q * scale).view(out, inputs).to(torch.bfloat16)
    back = quantized.dequantize(weight, "int4")
    error = (back - weight.float()).abs().view(out, groups, -1) / scale     # in quantization steps
    assert error.max() < 0.25                             # bfloat16's rounding of the grid, not a step
    assert error.mean() < 0.05


def test_unsupported_weights_are_refused_in_one_line():
    with pytest.raises(DFlash2Error, match="bfloat16"):
        quantized.quantize(_weight().float(), "int8")
    with pytest.raises(DFlash2Error, match="divisible"):
        quantized.quantize(_weight(out=64, inputs=80), "int4")
    with pytest.raises(DFlash2Error, match="one of int8, int4"):
        quantized.quantize(_weight(), "int2")
    with pytest.raises(DFlash2Error, match="must be one of"):
        projections.set_weights(_tiny(torch.bfloat16), "int3")


def test_a_model_quantizes_its_layers_and_keeps_its_lm_head():
    model, reference = _tiny(torch.bfloat16), _tiny(torch.bfloat16)
    projections.set_weights(model, "int8")
    layers = [m for m in model.modules() if isinstance(m, projections.Fusing) and m.quantizable]
    assert layers and all(p.quantized is not None for m in layers for p in m.projections())
    assert all(p.quantized is None for m in model.modules()
               if isinstance(m, projections.Fusing) and not m.quantizable for p in m.projections())
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    got, want = _logits(model, ids).float(), _logits(reference, ids).float()
    assert not torch.equal(got, want)                     # the quantized model is another model ...
    assert (got - want).abs().max() < 0.1 * want.abs().max()   # ... close to the float one
    with pytest.raises(DFlash2Error, match="bfloat16"):
        projections.set_weights(_tiny(torch.float32), "int8")



@pytest.mark.parametrize("scheme", quantized.SCHEMES)
def test_wide_passes_multiply_by_the_dequantized_weight(scheme):
    """Up to QUANTIZED_ROWS rows a quantized projection runs the quantized kernel (every row the same
    bits alone or among others); a wider pass (a prefill) multiplies by the same weight dequantised
    in the activations' dtype, and agrees with the kernel up to that rounding."""
    projection = _tiny(torch.bfloat16).model.layers[0].self_attn.qkv     # 64 inputs, 128 outputs
    projection.refresh(scheme)
    weight = projection.weight
    assert torch.equal(projection.dequantized, quantized.dequantize(weight, scheme).to(torch.bfloat16))
    x = torch.randn(projections.QUANTIZED_ROWS + 8, weight.shape[1], generator=torch.Generator().manual_seed(3))
    x = x.to(torch.bfloat16)
    narrow, wide = x[:projections.QUANTIZED_ROWS], x
    assert torch.equal(projection(narrow), quantized.matmul(narrow, projection.quantized))
    assert torch.equal(projection(wide), torch.nn.functional.linear(wide, projection.dequantized))
    by_rows = torch.cat([projection(row[None]) for row in wide]).float()
    assert torch.allclose(projection(wide).float(), by_rows, atol=0.05 * by_rows.abs().max().item())
