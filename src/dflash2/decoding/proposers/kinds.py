"""Which proposers a decoder can have, which one it gets when none is named, and the block size each
proposes in: the one home of these rules (the engine, the pipeline and the commands use them).

Contract:
- `PROPOSERS`: `draft` (the draft model's block), `lookup` (`lookup`: what followed the row's latest
  tokens before; no model), `hybrid` (both, each row verifying what the policy expects to commit
  more, or both as a token tree). `check_proposer(name, what)` refuses any other name in one line.
- `DEFAULT_PROPOSER` (`hybrid`): what a command runs with a trained draft (the fastest measured,
  BENCHMARKS.md section 8); `decoder_default(has_draft)`: what a decoder built without naming a
  proposer runs: `draft` when it has a draft, else none (plain decoding).
- `block_size(proposer, draft_block, requested)`: tokens a cycle (anchor included): 1 without a
  proposer (or a draft to set it); else the request's block size, or by default the draft's own
  (`lookup` alone: `LOOKUP_BLOCK_SIZE`).
"""
from __future__ import annotations

from dflash2.errors import require

PROPOSERS = ("draft", "lookup", "hybrid")
DRAFT_PROPOSERS = ("draft", "hybrid")    # the proposers that need a draft
DEFAULT_PROPOSER = "hybrid"
LOOKUP_BLOCK_SIZE = 8


def check_proposer(name: str | None, what: str = "proposer") -> None:
    require(name is None or name in PROPOSERS, f"{what} must be one of {', '.join(PROPOSERS)}, got '{name}'")


def decoder_default(has_draft: bool) -> str | None:
    return "draft" if has_draft else None


def block_size(proposer: str | None, draft_block: int | None, requested: int | None) -> int:
    own = None if proposer is None else LOOKUP_BLOCK_SIZE if proposer == "lookup" else draft_block
    return 1 if own is None else requested or own
