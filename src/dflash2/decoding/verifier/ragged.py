"""Left-padded ragged batches: every row's slots are in time order and the newest end at the right edge.

Contract:
- `right_align(buffer, shift, delta)` re-aligns a batch after rows kept different numbers of new
  slots. Row r moves right by `shift[r]` slots (zeros enter on the left, marked invalid by the
  caller's mask) and the buffer changes length by `delta` (<= 0). One gather, no per-row loop.
- A batch may instead keep "holes" (invalid slots between valid ones, masked out). `worth_compacting(mask)`
  says when holes and padding take enough room to pay for one gather; `compaction_index(mask)`
  gives, per row, the slots to keep [b, S'] (S' = the longest row's valid count): each row's valid
  slots in their order, right-aligned, invalid ones before them. `buffer.gather` along the slot
  dimension with it compacts the batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def right_align(buffer: torch.Tensor, shift: torch.Tensor, delta: int) -> torch.Tensor:
    """buffer [b, slots, ...] -> [b, slots + delta, ...] (delta <= 0): row r shifted right by
    shift[r] (zeros enter on the left, its last slots beyond the new end fall off)."""
    b, slots = buffer.shape[:2]
    out_slots = slots + delta
    pad = int(shift.max())
    padded = F.pad(buffer.movedim(1, -1), (pad, 0)).movedim(-1, 1)    # [b, pad + slots, ...]
    # row r's new slot j reads old slot j - shift[r] (+ pad offset in `padded`)
    index = torch.arange(out_slots, device=buffer.device)[None, :] - shift[:, None] + pad  # [b, out]
    index = index.view(b, out_slots, *([1] * (buffer.dim() - 2))).expand(b, out_slots, *buffer.shape[2:])
    return padded.gather(1, index)


def worth_compacting(mask: torch.Tensor, slack: float = 0.5, minimum: int = 64) -> bool:
    """mask [b, S] (True / 1 = valid): more than `slack` x the longest row's valid count (and
    `minimum` slots) are invalid."""
    longest = int(mask.sum(dim=1).max())
    return mask.shape[1] - longest > max(minimum, slack * longest)


def compaction_index(mask: torch.Tensor) -> torch.Tensor:
    """mask [b, S] -> index [b, S']: per row the slots to keep, valid ones right-aligned in order."""
    longest = int(mask.sum(dim=1).max())
    order = torch.sort(mask.long(), dim=1, stable=True).indices      # invalid slots first, each group in order
    return order[:, mask.shape[1] - longest:]
