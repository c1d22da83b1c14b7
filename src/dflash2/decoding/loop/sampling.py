"""Per-row sampling settings of a decoding batch.

Contract: `RowSampling.stack(settings, device)` turns each row's (temperature, top_k, top_p, seed)
into [b] tensors; `select(rows)` / `cat(other)` follow the batch as rows leave and join.
Temperature 0 means greedy for that row; greedy and sampled rows share one batch. The random
numbers themselves come from `dflash2.runtime.rng` (hashed from each row's seed and positions).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """Sampling settings of the rows of a batch, as [b] tensors."""
    temperature: torch.Tensor   # [b] float32, 0 = greedy
    top_k: torch.Tensor         # [b] int64, 0 = off
    top_p: torch.Tensor         # [b] float32, 1 = off
    seed: torch.Tensor          # [b] int64

    @classmethod
    def stack(cls, rows: list[tuple[float, int, float, int]], device) -> "RowSampling":
        temperature, top_k, top_p, seed = zip(*rows)
        return cls(torch.tensor(temperature, dtype=torch.float32, device=device),
                   torch.tensor(top_k, dtype=torch.int64, device=device),
                   torch.tensor(top_p, dtype=torch.float32, device=device),
                   torch.tensor(seed, dtype=torch.int64, device=device))

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature <= 0

    @property
    def all_greedy(self) -> bool:
        return bool(self.greedy.all())

    def select(self, rows: torch.Tensor) -> "RowSampling":
        return RowSampling(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.seed[rows])

    def cat(self, other: "RowSampling") -> "RowSampling":
        return RowSampling(*(torch.cat([a, b]) for a, b in
                             zip((self.temperature, self.top_k, self.top_p, self.seed),
                                 (other.temperature, other.top_k, other.top_p, other.seed))))
