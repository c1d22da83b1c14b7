"""Two-tap grouped dynamic convolution (DFlash2, docs/spec.md §2.3).

Contract: `GroupedDynamicConv` wraps one draft sublayer (attention or MLP). Inputs are laid out
per block, `[batch, n_blocks, block_size, H]`, so the convolution can never cross a block
boundary: the left neighbour of a block's first position is zero.

    prepare(x_normed) -> (x_conv, coeffs)   # coeffs for both sides; side 0 applied to x_normed
    finish(y, coeffs) -> y_conv             # side 1 applied to the sublayer output

with, per side s, tap o (0 = the token itself, 1 = its left neighbour) and channel c of group g(c):
    y_t[c] = sum_o (base[s, o, c] + d_t[s, o, g(c)]) * x_{t-o}[c],   d = kernel_projection(x_normed)

The identity initialisation (base[:, 0] = 1, base[:, 1] = 0, kernel_projection = 0) makes a
fresh DFlash2 layer compute exactly what a DFlash v1 layer computes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash2.model.packing import project, repack


class GroupedDynamicConv(nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int = 2, group_size: int = 16):
        super().__init__()
        self.kernel_size = kernel_size
        self.groups = hidden_size // group_size
        self.group_size = group_size
        # base_kernel[side, tap, channel]; checkpoint name and shape are part of the format.
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.packed_kernel = None   # `pack`: an inference copy of kernel_projection (`model.packing`)
        self.reset_parameters()

    def pack(self) -> None:
        self.packed_kernel = repack(self.packed_kernel, self.kernel_projection.weight)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0, :] = 1.0
            self.kernel_projection.weight.zero_()

    def coefficients(self, x_normed: torch.Tensor) -> torch.Tensor:
        """[b, n, B, H] -> per-channel tap weights [b, n, B, 2 sides, K taps, H]."""
        dynamic = project(x_normed, self.packed_kernel, self.kernel_projection.weight)[0]
        dynamic = dynamic.view(*x_normed.shape[:-1], 2, self.kernel_size, self.groups, 1)    # groups -> channels:
        base = self.base_kernel.to(dynamic.dtype).view(2, self.kernel_size, self.groups, self.group_size)
        return (base + dynamic).flatten(-2)                                                  # by broadcasting

    def apply_side(self, x: torch.Tensor, coeffs: torch.Tensor, side: int) -> torch.Tensor:
        """Causal within each block: x [b, n, B, H], coeffs [b, n, B, 2, K, H]. Without gradients a
        tap's terms are added in place to the positions t >= tap only: those before take c * 0,
        which changes nothing but the sign of a zero (no padded copy of x)."""
        out = coeffs[..., side, 0, :] * x
        block = x.shape[-2]
        for tap in range(1, self.kernel_size):
            if torch.is_grad_enabled():
                shifted = F.pad(x, (0, 0, tap, 0))[..., :block, :]  # x_{t-tap}, zero before the block start
                out = out + coeffs[..., side, tap, :] * shifted
            elif tap < block:
                out[..., tap:, :] += coeffs[..., tap:, side, tap, :] * x[..., :block - tap, :]
        return out

    def prepare(self, x_normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        coeffs = self.coefficients(x_normed)
        return self.apply_side(x_normed, coeffs, 0), coeffs

    def finish(self, y: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
        return self.apply_side(y, coeffs, 1)
