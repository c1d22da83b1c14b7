"""Which proposers a decoder can have, which one it gets when none is named, the block size each
proposes in, and which draft side a draft model makes: the one home of these rules (the engine,
the pipeline and the commands use them).

Contract:
- `PROPOSERS`: `draft` (the DFlash draft model's block), `lookup` (`lookup`: what followed the row's
  latest tokens before; no model), `hybrid` (a draft model's proposal and lookup's, each row
  verifying what the policy expects to commit more, or both as a token tree), `mtp` (an MTP head,
  `model.mtp`, applied recursively: `proposers.mtp`). `check_proposer(name, what)` refuses any
  other name in one line.
- `DRAFT_PROPOSERS`: those that run a draft model (`draft`, `hybrid`, `mtp`). A draft model is of a
  family (`model.families.family_of`: `dflash2`, DFlash v1 included, or `mtp`); `model_proposer(family)`
  is the proposer that runs it alone (`mtp` for a head, else `draft`) and `check_family(proposer,
  family, what, draft)` refuses `draft` with a head and `mtp` with a DFlash draft in one line
  (`hybrid` takes either).
- `DEFAULT_PROPOSER` (`hybrid`): what a command runs with a trained draft (the fastest measured,
  BENCHMARKS.md section 8); `decoder_default(has_draft, family)`: what a decoder built without
  naming a proposer runs: the family's own proposer when it has a draft, else none (plain decoding).
- `block_size(proposer, draft_block, requested)`: tokens a cycle (anchor included): 1 without a
  proposer (or a draft to set it); else the request's block size, or by default the draft's own
  (`lookup` alone: `LOOKUP_BLOCK_SIZE`).
- `drafter_for(draft, target, lattice)`: the `Drafter` (block size and proposer maker) a draft model
  makes over a `TargetAdapter`: `DraftProposer`s of a DFlash draft (its lattice's second path with
  `lattice`, on attention-only targets), `MtpProposer`s of a head (reading the target's final norm).
"""
from __future__ import annotations

from dflash2.decoding.proposers.draft import Drafter
from dflash2.decoding.proposers.mtp import mtp_drafter
from dflash2.errors import DFlash2Error, require
from dflash2.model.families import family_of
from dflash2.model.mtp import target_final_norm

PROPOSERS = ("draft", "lookup", "hybrid", "mtp")
DRAFT_PROPOSERS = ("draft", "hybrid", "mtp")    # the proposers that need a draft model
DEFAULT_PROPOSER = "hybrid"
LOOKUP_BLOCK_SIZE = 8


def check_proposer(name: str | None, what: str = "proposer") -> None:
    require(name is None or name in PROPOSERS, f"{what} must be one of {', '.join(PROPOSERS)}, got '{name}'")


def model_proposer(family: str) -> str:
    return "mtp" if family == "mtp" else "draft"


def check_family(proposer: str | None, family: str | None, what: str = "proposer", draft: str = "this draft") -> None:
    """One line unless a draft model of `family` (None: no model) can serve `proposer`."""
    if proposer in ("draft", "mtp") and family is not None and model_proposer(family) != proposer:
        kind = {"mtp": "an MTP head", "draft": "a DFlash draft"}
        raise DFlash2Error(f"{what} {proposer} needs {kind[proposer]}, and {draft} is {kind[model_proposer(family)]}: "
                           f"use {what} {model_proposer(family)} (or hybrid, its proposals beside lookup's)")


def decoder_default(has_draft: bool, family: str = "dflash2") -> str | None:
    return model_proposer(family) if has_draft else None


def block_size(proposer: str | None, draft_block: int | None, requested: int | None) -> int:
    own = None if proposer is None else LOOKUP_BLOCK_SIZE if proposer == "lookup" else draft_block
    return 1 if own is None else requested or own


def drafter_for(draft, target, lattice: bool = False) -> Drafter:
    if family_of(draft) == "mtp":
        return mtp_drafter(draft, target_final_norm(target.model))
    return Drafter.of(draft, lattice=lattice and not target.hybrid)
