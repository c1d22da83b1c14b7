"""The context rule of a decoding request (its block size: `proposers.kinds.block_size`).

Contract:
- `context_room(prompt_tokens, block, limit)`: the most new tokens a request may ask for: the
  prompt, the new tokens and one block (the last cycle's drafts) must fit in the target's `limit`
  positions.
- `check_context(prompt_tokens, max_new_tokens, block, limit)` applies that rule, refusing a request
  that does not fit with a one-line `ContextLimitError` (a `DFlash2Error`) giving the whole sum,
  its numbers as fields.
"""
from __future__ import annotations

from dflash2.errors import ContextLimitError


def context_room(prompt_tokens: int, block: int, limit: int) -> int:
    return limit - prompt_tokens - block


def check_context(prompt_tokens: int, max_new_tokens: int, block: int, limit: int) -> None:
    if max_new_tokens > context_room(prompt_tokens, block, limit):
        raise ContextLimitError(prompt_tokens, max_new_tokens, block, limit)
