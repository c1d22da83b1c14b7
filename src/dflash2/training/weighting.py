"""Per-label weights of the block loss: a fixed position decay, or D-PACE confidence weights.

Contract:
- `position_weights(block_size, gamma)` -> w [B-1], w_k = exp(-(k-1)/gamma) for k = 1..B-1
  (gamma = inf gives all ones). `label_weights(batch, w)` -> [b, N, B-1]: that weight on every
  supervised label, 0 elsewhere (unsupervised positions, padding blocks).
- `dpace_weights(confidence, mask, alpha)` -> [..., T], detached: D-PACE (dynamic position-aware
  cross-entropy). With q_i the draft's probability of the true token at block position i
  (exp(-CE_i)) and its smoothed form q~_i = (1 - alpha) q_i + alpha,
      w_j = sum over supervised m >= j of  prod_{i <= m} q~_i.
  prod_{i<=m} q_i is the probability that the first m drafted tokens are all accepted, so
  E[accepted] = sum_m prod_{i<=m} q_i and w_j (at alpha 0) is d E[accepted] / d log q_j: a position
  weighs what its getting right is worth to the accepted length, given the draft's present
  confidence in the positions before it. Early positions always weigh most, and later ones gain
  weight as the early ones become reliable. Smoothing (alpha > 0) keeps later positions from
  starving while the draft is still poor; alpha = 1 gives w_j = number of supervised positions from
  j on. Positions where `mask` is False get 0 and add nothing to the sums.
- `WEIGHTINGS`: the values of `loss.position_weighting` ("decay", "dpace").
- `step_share(batch, w, weighting)` -> float: a micro-batch's part of the step's loss normaliser
  (the trainer sums it over all micro-batches and ranks before any forward). "decay": the sum of
  its label weights, so the token loss is the decay-weighted mean CE. "dpace": its number of real
  blocks, i.e. the loss is the weighted CE summed per block and averaged over blocks; dividing by
  the sum of D-PACE weights instead would cancel the accepted-length credit they carry (the D-PACE
  author's correction to the first integrations).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dflash2.training.batches import Batch

WEIGHTINGS = ("decay", "dpace")


def position_weights(block_size: int, gamma: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """w [B-1]: exp(-(k-1)/gamma), k = 1..B-1."""
    k = torch.arange(block_size - 1, dtype=torch.float32, device=device)
    if math.isinf(gamma):
        return torch.ones_like(k)
    return torch.exp(-k / gamma)


def label_weights(batch: "Batch", weights: torch.Tensor) -> torch.Tensor:
    """[b, N, B-1] weight of every label (0 where unsupervised or a padding block)."""
    return batch.label_mask.float() * weights.to(batch.label_mask.device)


@torch.no_grad()
def dpace_weights(confidence: torch.Tensor, mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """confidence, mask [..., T] -> D-PACE weights [..., T] (see the module docstring)."""
    smoothed = (1 - alpha) * confidence.float() + alpha
    reach = torch.cumprod(smoothed, dim=-1) * mask                               # [..., T] P(accept 1..m)
    return reach.flip(-1).cumsum(-1).flip(-1) * mask                             # suffix sums over m >= j


def step_share(batch: "Batch", weights: torch.Tensor, weighting: str) -> float:
    """This micro-batch's part of the step's loss normaliser (see the module docstring)."""
    if weighting == "dpace":
        return float(batch.block_valid.float().sum())
    return float(label_weights(batch, weights).sum())
