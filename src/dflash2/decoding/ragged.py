"""Left-padded ragged batches: each row's tokens are contiguous and end at the right edge.

Contract: `right_align(buffer, shift, delta)` re-aligns a batch after rows kept different numbers
of new slots. Row r moves right by `shift[r]` slots (zeros enter on the left, marked invalid by the
caller's mask) and the buffer changes length by `delta` (<= 0). One gather, no per-row loop.
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
