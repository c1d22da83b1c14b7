"""Inference-time packed projections of a draft: several linear layers that read one input (q, k, v;
gate, up) in one matmul, on prepacked oneDNN weights where that pays, without touching the module.

Contract:
- `Packed(*weights, form)` keeps a copy of the weights ([out_i, in] each, one input size) as one
  `targets.projections.Projection` (concatenated along the output dimension, so each output is
  still its own row's dot product with x) in `form`: "packed" (oneDNN's layout) or "plain"
  (`F.linear` on the concatenated weight). The module's parameters, hence `state_dict()`, the
  checkpoint format, training and export, are unchanged.
- `fresh()`: the copy still holds what the weights hold: same tensors (storage, dtype, device) and
  no in-place change since (`_version`: an optimiser step, `load_state_dict`, `.copy_`).
- `project(x, pack, *weights)` -> the outputs of each weight for x, `[..., out_i]` each: through the
  pack when it is given, fresh and no gradient is recorded; else `F.linear` weight by weight (the
  module's own arithmetic; training always takes this path).
- A pack computes the bits its weights' `F.linear`s compute, so a draft proposes what its modules
  would, bit for bit: "packed" runs oneDNN's packed kernel up to `projections.SAME_BITS_ROWS` rows
  (where it agrees with `F.linear`; 1.5-1.8x faster matmuls of a batch-1 draft pass's 7-8 rows
  here), `F.linear` on the concatenated weight up to `projections.FUSED_ROWS` (the packed kernel
  rounds its own way there: 6 of 64 tokens of the shipped draft at batch 8 changed on near ties;
  the concatenated weight gives each part's bits up to 134 rows and more, float32 and bfloat16),
  and each weight's own `F.linear` beyond (prefills: there a concatenated bfloat16 weight rounds
  its own way from 200 rows).
- `default_form(weight)`: "packed" for bfloat16 where oneDNN prepacks it, else "plain" (float32:
  oneDNN's packed float32 kernel rounds differently from MKL's at any size above one row).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash2.targets.projections import FUSED_ROWS, SAME_BITS_ROWS, Projection, can_pack


def default_form(weight: torch.Tensor) -> str:
    return "packed" if weight.dtype == torch.bfloat16 and can_pack(weight) else "plain"


def _signature(weights: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((w.data_ptr(), w._version, w.dtype, w.device, tuple(w.shape)) for w in weights)


class Packed:
    """Not a module: a copy of `weights` for inference (see the contract)."""

    def __init__(self, *weights: torch.Tensor, form: str | None = None):
        self.weights = weights
        self.sizes = [w.shape[0] for w in weights]
        self.signature = _signature(weights)
        parts = []
        for weight in weights:   # frozen stand-ins: `Projection` concatenates nn.Linear parts
            part = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
            part.weight = nn.Parameter(weight.detach(), requires_grad=False)
            parts.append(part)
        self.projection = Projection(*parts)
        self.projection.refresh(form or default_form(weights[0]), share=False)

    def serves(self, weights: tuple[torch.Tensor, ...]) -> bool:
        """These very tensors, unchanged since the copy (`fresh`)."""
        return len(weights) == len(self.weights) and all(a is b for a, b in zip(weights, self.weights)) and self.fresh()

    def __deepcopy__(self, memo) -> None:   # a copied module packs anew (oneDNN's layout does not copy)
        return None

    def __reduce__(self):                      # nor pickle: a pickled module holds no pack
        return type(None), ()

    def fresh(self) -> bool:
        return _signature(self.weights) == self.signature

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [..., in] -> each weight's output [..., out_i] (see the contract for the kernel)."""
        rows = x.numel() // x.shape[-1]
        if rows > FUSED_ROWS:
            return [F.linear(x, w) for w in self.weights]
        if self.projection.packed is not None and rows > SAME_BITS_ROWS:   # the packed kernel would round its own way
            return list(F.linear(x, self.projection.weight).split(self.sizes, dim=-1))
        return list(self.projection(x).split(self.sizes, dim=-1))


def project(x: torch.Tensor, pack: Packed | None, *weights: torch.Tensor) -> list[torch.Tensor]:
    """x [..., in] -> [x @ w.T for w in weights] ([..., out_i] each), by `pack` where it serves."""
    if pack is not None and not torch.is_grad_enabled() and pack.serves(weights):
        return pack(x)
    return [F.linear(x, w) for w in weights]


def repack(pack: Packed | None, *weights: torch.Tensor) -> Packed | None:
    """`pack` while it is fresh for `weights`, else a new one (None for meta weights: not loaded)."""
    if any(w.is_meta for w in weights):
        return None
    if pack is not None and pack.serves(weights):
        return pack
    return Packed(*weights)
