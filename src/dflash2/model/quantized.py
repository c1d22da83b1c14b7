"""Weight-only int8 / int4 forms of a projection's weight, for targets that are quantized anyway.

Contract:
- `SCHEMES = ("int8", "int4")`. `quantize(weight, scheme)` -> `QuantizedWeight`; `matmul(x, q)`
  computes x @ dequantize(weight, scheme)^T with torch's weight-only CPU kernels
  (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`), x [.., in] in the weight's dtype ->
  [.., out]; `dequantize(weight, scheme)` is the float32 weight they multiply by (the reference).
- int8: one symmetric scale per output row (max |w| / 127), q = round(w / scale).
- int4: asymmetric groups of `INT4_GROUP` (32) inputs per output row (GGUF Q4_0 / Q4_1 blocks):
  scale = (max - min) / 15, q = round((w - min) / scale) in 0..15, and the kernel's form
  w = (q - 8) * scale + zero with zero = min + 8 * scale; scale and zero are stored in the
  activations' dtype (the kernel's rule). A weight already on such a grid (SmolLM2's GGUF is
  Q4_1: every layer weight is min + q * scale exactly) comes back up to the rounding of scale and
  zero to that dtype (bfloat16: under 5 % of a quantization step, measured).
- `check_supported(weight, scheme)` refuses, in one line, what the kernels cannot take: another
  device than the CPU, a dtype other than bfloat16 (float32 activations run these kernels slower
  than the float32 weights themselves: measured 2x for int8, 5x for int4), int4 input sizes that
  are not a multiple of the group or output sizes not a multiple of 16.
The model is then the quantized one: exactness (greedy speculative output = plain output) holds
against that same quantized target, never against the float weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash2.errors import require

SCHEMES = ("int8", "int4")
INT4_GROUP = 32
_INT4_TILES = 1                   # innerKTiles of the CPU int4 packing (1 is the layout the CPU kernel reads)


@dataclass
class QuantizedWeight:
    scheme: str
    values: torch.Tensor          # int8 [out, in]; int4: the kernel's packed layout
    scales: torch.Tensor          # int8 [out]; int4 [in / group, out, 2] (scale, zero)
    shape: tuple[int, int]        # [out, in]


def check_supported(weight: torch.Tensor, scheme: str) -> None:
    require(scheme in SCHEMES, f"weight quantization must be one of {', '.join(SCHEMES)}, got '{scheme}'")
    require(weight.device.type == "cpu", f"{scheme} weights run on the CPU only, not {weight.device.type}")
    require(weight.dtype == torch.bfloat16,
            f"{scheme} weights run with bfloat16 activations (their CPU kernels); the target is {weight.dtype}")
    out, inputs = weight.shape
    if scheme == "int4":
        require(inputs % INT4_GROUP == 0 and out % 16 == 0,
                f"int4 weights need input sizes divisible by {INT4_GROUP} and output sizes by 16, not {out} x {inputs}")


def _grid(weight: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The integer values and their scales (and int4 zeros), before storage: int8 q [out, in] and
    scale [out]; int4 q [out, in] in 0..15, scale and zero [out, in / group]."""
    w = weight.detach().float()
    out, inputs = w.shape
    tiny = torch.finfo(torch.float32).tiny
    if scheme == "int8":
        scale = (w.abs().amax(dim=1) / 127).clamp(min=tiny)                                  # [out]
        return (w / scale[:, None]).round().clamp(-128, 127), scale, None
    groups = w.view(out, inputs // INT4_GROUP, INT4_GROUP)                                 # [out, in/g, g]
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=tiny)                                            # [out, in/g]
    q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).view(out, inputs)
    return q, scale, low + 8 * scale


def quantize(weight: torch.Tensor, scheme: str) -> QuantizedWeight:
    check_supported(weight, scheme)
    q, scale, zero = _grid(weight, scheme)
    if scheme == "int8":
        return QuantizedWeight(scheme, q.to(torch.int8), scale.to(weight.dtype), tuple(weight.shape))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), _INT4_TILES)
    # [in/g, out, 2]: the kernel's (scale, zero) per group, w = (q - 8) * scale + zero
    scales = torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(weight.dtype)
    return QuantizedWeight(scheme, packed, scales, tuple(weight.shape))


def matmul(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])                                                       # [n, in]
    if weight.scheme == "int8":
        y = torch.ops.aten._weight_int8pack_mm(rows, weight.values, weight.scales)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, weight.values, INT4_GROUP, weight.scales)
    return y.view(*x.shape[:-1], weight.shape[0])


def dequantize(weight: torch.Tensor, scheme: str) -> torch.Tensor:
    """The float32 weight [out, in] that `matmul(x, quantize(weight, scheme))` multiplies by."""
    q, scale, zero = _grid(weight, scheme)
    if scheme == "int8":
        return q * scale.to(weight.dtype).float()[:, None]
    per_input = lambda t: t.to(weight.dtype).float().repeat_interleave(INT4_GROUP, dim=1)   # noqa: E731
    return (q - 8) * per_input(scale) + per_input(zero)
