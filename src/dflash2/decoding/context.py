"""The block-size and context rules of a decoding request: one home for both.

Contract:
- `effective_block_size(draft_block, requested)`: tokens per cycle: 1 without a draft
  (`draft_block` None), else the request's block size or the draft's own.
- `context_room(prompt_tokens, block, limit)`: the most new tokens a request may ask for: the
  prompt, the new tokens and one block (the last cycle's drafts) must fit in the target's `limit`
  positions.
- `check_context(prompt_tokens, max_new_tokens, block, limit)` applies that rule, refusing a request
  that does not fit with a one-line `DFlash2Error` giving the whole sum.
"""
from __future__ import annotations

from dflash2.errors import require


def effective_block_size(draft_block: int | None, requested: int | None) -> int:
    return 1 if draft_block is None else (requested or draft_block)


def context_room(prompt_tokens: int, block: int, limit: int) -> int:
    return limit - prompt_tokens - block


def check_context(prompt_tokens: int, max_new_tokens: int, block: int, limit: int) -> None:
    require(max_new_tokens <= context_room(prompt_tokens, block, limit),
            f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} + block size {block} = "
            f"{prompt_tokens + max_new_tokens + block} exceeds the target's context limit of {limit} tokens")
