"""Inference-time packed projections of a draft: several linear layers that read one input (q, k, v;
gate, up) in one matmul, on prepacked oneDNN weights where that pays, without touching the module.

Contract:
- `Packed(*weights)` keeps a copy of the weights ([out_i, in] each, one input size) as one
  `model.projections.Projection` (concatenated along the output dimension, so each output is
  still its own row's dot product with x) in the form `default_form` picks: "packed" (oneDNN's
  layout) where oneDNN prepacks the weight (bfloat16 on CPUs that compute it natively, float32 on
  any CPU), else "plain" (`F.linear` on the concatenated weight: CUDA, MPS).
  The module's parameters, hence `state_dict()`, the checkpoint format, training and export, are
  unchanged. Not copied with its module (`deepcopy`) and not pickled.
- `project(x, pack, *weights)` -> the outputs of each weight for x, `[..., out_i]` each: through the
  pack where it is a pack of these very tensors and no gradient is recorded; else `F.linear`
  weight by weight (the module's own arithmetic; training always takes this path). A pack whose
  weights changed since its copy (storage, or in place: `_version`, as an optimiser step,
  `load_state_dict` or `.copy_` leave them) copies them again before it serves.
- Bits. "plain" gives each weight's own `F.linear` bits (the concatenated weight does, float32 and
  bfloat16, at every pass size up to `projections.FUSED_ROWS`). "packed" runs oneDNN's packed
  kernel up to `FUSED_ROWS` rows (the kernel `projections.kernel` picks: 1.5-1.8x faster
  matmuls of a draft pass's 7-64 rows). In bfloat16, up to `projections.SAME_BITS_ROWS` rows (a batch-1
  pass) it gives `F.linear`'s bits; in float32 it rounds its own way (~1e-6 relative; the same
  tokens in the cases tested). Beyond those sizes, where `F.linear` changes algorithm and a row's
  result starts to depend on the batch around it, the packed kernel keeps giving every row its
  one-row bits where `projections.row_invariant` holds, so a batch proposes what each of its rows
  would propose alone (tests/test_draft_pass.py; `F.linear` would not). Proposals only propose:
  verification decides what is committed, so their rounding never reaches the output. Above
  `FUSED_ROWS` (prefills) every weight runs its own `F.linear` (a concatenated bfloat16 weight
  rounds its own way from about 200 rows).
- `project_joined(x, pack, *weights)`: the same outputs side by side, [..., sum(out_i)], where the
  pack serves them from one matmul; else None (the caller then takes `project`'s).
- `repack(pack, *weights)`: `pack` where it holds these tensors, else a new pack of them (None for
  weights not loaded yet, on the meta device).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash2.model.projections import FUSED_ROWS, Projection, can_pack


def default_form(weight: torch.Tensor) -> str:
    return "packed" if can_pack(weight) else "plain"


def _signature(weights: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((w.data_ptr(), w._version) for w in weights)


class Packed:
    """Not a module: a copy of `weights` for inference (see the contract)."""

    def __init__(self, *weights: torch.Tensor):
        self.weights = weights
        self.sizes = [w.shape[0] for w in weights]
        self.signature: tuple | None = None
        self.projection: Projection | None = None
        self._copy()

    def _copy(self) -> None:
        parts = []
        for weight in self.weights:   # frozen stand-ins: `Projection` concatenates nn.Linear parts
            part = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
            part.weight = nn.Parameter(weight.detach(), requires_grad=False)
            parts.append(part)
        self.projection = Projection(*parts)
        self.projection.refresh(default_form(self.weights[0]), share=False)
        self.signature = _signature(self.weights)

    def holds(self, weights: tuple[torch.Tensor, ...]) -> bool:
        return len(weights) == len(self.weights) and all(a is b for a, b in zip(weights, self.weights))

    def __deepcopy__(self, memo) -> None:   # a copied module packs anew (oneDNN's layout does not copy)
        return None

    def __reduce__(self):                      # nor pickle: a pickled module holds no pack
        return type(None), ()

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [..., in] -> each weight's output [..., out_i] (see the contract for the kernel)."""
        whole = self.joined(x)
        if whole is None:
            return [F.linear(x, w) for w in self.weights]
        return [whole] if len(self.weights) == 1 else list(whole.split(self.sizes, dim=-1))

    def joined(self, x: torch.Tensor) -> torch.Tensor | None:
        """x [..., in] -> the outputs side by side [..., sum(out_i)], from one matmul; None above
        `FUSED_ROWS` rows (there each weight runs its own)."""
        rows = x.numel() // x.shape[-1]
        if rows > FUSED_ROWS:
            return None
        if _signature(self.weights) != self.signature:
            self._copy()
        return self.projection(x)


def project(x: torch.Tensor, pack: Packed | None, *weights: torch.Tensor) -> list[torch.Tensor]:
    """x [..., in] -> [x @ w.T for w in weights] ([..., out_i] each), by `pack` where it serves."""
    if pack is not None and not torch.is_grad_enabled() and pack.holds(weights):
        return pack(x)
    return [F.linear(x, w) for w in weights]


def project_joined(x: torch.Tensor, pack: Packed | None, *weights: torch.Tensor) -> torch.Tensor | None:
    """`project`'s outputs side by side [..., sum(out_i)] where the pack serves and computes them in
    one matmul (`Packed.joined`), else None."""
    if pack is not None and not torch.is_grad_enabled() and pack.holds(weights):
        return pack.joined(x)
    return None


def repack(pack: Packed | None, *weights: torch.Tensor) -> Packed | None:
    """`pack` where it holds these tensors, else a new pack of them (None for meta weights)."""
    if any(w.is_meta for w in weights):
        return None
    return pack if pack is not None and pack.holds(weights) else Packed(*weights)
