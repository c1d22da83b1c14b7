"""Block visibility: what a draft block attends to, the one rule shared by training, decoding and analysis.

Contract (docs/spec.md §2.3, §4): a block `[anchor, MASK, ...]` sees the context strictly before its
anchor and inside the sliding window, and itself bidirectionally; never another block.

`block_visibility(block_positions, context_positions, window, context_valid=None)`:
- `block_positions` [b, N, B]: the absolute positions of N blocks of B tokens per row; position
  [..., 0] is the block's anchor (a block at start s is s, s+1, ..., s+B-1).
- `context_positions` [b, S] or [S] (the same for every row): the absolute position of each
  context key slot. `context_valid` [b, S] bool (optional): False marks slots that are not context
  (left padding of a decoding cache).
- Returns the attention mask [b, 1, N*B, S + N*B], True = visible, keys laid out `[context | block_0
  .. block_N-1]` as `DFlash2DraftModel.forward_blocks` takes them. Query (block j, offset k) at
  position p sees context slot s iff the slot is valid, `context_positions[s] < anchor_j`, and,
  with a window, `p - context_positions[s] < window`: the window is applied per query position,
  not per block. `window` None or 0 means no window.
- Training packs every block of a sequence (N blocks, context = the whole sequence at 0..L-1); the
  proposer runs one block (N = 1) against its cache; both get their mask here.
"""
from __future__ import annotations

import torch


def block_visibility(block_positions: torch.Tensor, context_positions: torch.Tensor, window: int | None,
                     context_valid: torch.Tensor | None = None) -> torch.Tensor:
    b, n, block = block_positions.shape
    query = block_positions.reshape(b, n * block)                                        # [b, Q]
    anchor = block_positions[:, :, :1].expand(b, n, block).reshape(b, n * block)         # [b, Q]
    keys = context_positions if context_positions.dim() == 2 else context_positions[None]  # [b or 1, S]
    context = keys[:, None, :] < anchor[:, :, None]                                        # [b, Q, S]
    if window:
        context = context & (query[:, :, None] - keys[:, None, :] < window)
    if context_valid is not None:
        context = context & context_valid[:, None, :].bool()
    owner = torch.arange(n * block, device=block_positions.device) // block              # [Q] block of each query
    own = (owner[:, None] == owner[None, :]).expand(b, -1, -1)                            # [b, Q, Q]
    return torch.cat([context, own], dim=-1)[:, None]                                      # [b, 1, Q, S+Q]
