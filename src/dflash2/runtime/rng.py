"""Counter-based random numbers for decoding: a row's draws depend on its seed and positions only.

Contract:
- `uniforms(seeds, positions, kind)` gives one uniform in [0, 1) per (row seed, sequence position,
  kind of draw), computed by hashing (splitmix64), not drawn from a stateful generator. A row's
  random numbers therefore depend only on its own seed and the positions it decides: the same
  seeded request gives the same text alone or inside any batch, and rows never share draws.
  Kinds: `DRAFT` (the draft's own sample), `ACCEPT` (the acceptance test), `TOKEN` (a token drawn
  from the target: residual, bonus or autoregressive sample). Within one cycle each (position,
  kind) is used at most once; a draft position discarded after an earlier rejection is drafted
  again next cycle with the same numbers, which is sound because nothing committed depended on
  them.
- `sample_from(probs, u)`: inverse-CDF draw of one index per row of probs [..., V] with u [...];
  an index of probability 0 is never returned.
- `row_seed(seed, index)`: the seed of row `index` of a request seeded `seed` (rows of one
  `generate` call are independent samples).
"""
from __future__ import annotations

import torch

DRAFT, ACCEPT, TOKEN = 0, 1, 2

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 torch stores it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors (multiplication wraps modulo 2^64)."""
    x = x + _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def row_seed(seed: int, index: int) -> int:
    """Seed of row `index` of a request seeded `seed`, as a Python int (int64 range)."""
    mixed = _mix(torch.tensor([_signed(seed) ^ _signed(index * 0x632BE59BD9B4E019)], dtype=torch.int64))
    return int(mixed)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, kind: int) -> torch.Tensor:
    """seeds [b] int64, positions [b, n] (or [b]) int64 -> float64 uniforms in [0, 1) (53 bits),
    same shape as positions."""
    seeds = seeds.to(torch.int64)
    positions = positions.to(torch.int64)
    if positions.dim() == 2:
        seeds = seeds[:, None]
    x = _mix(_mix(seeds) ^ (positions * 4 + kind))
    return _shift_right(x, 11).to(torch.float64) * (1.0 / (1 << 53))


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [..., V] (rows need not be normalised), u [...] -> index [...] (int64)."""
    cdf = probs.float().cumsum(dim=-1)
    target = (u.double() * cdf[..., -1].double()).to(cdf.dtype).unsqueeze(-1)
    index = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).squeeze(-1)
    return index.clamp(max=probs.shape[-1] - 1)
