"""Draft families: a DFlash / DFlash2 block draft or an MTP head, chosen by what a checkpoint is.

Contract:
- `FAMILIES` = ("dflash2", "mtp"): the draft families this package builds and trains.
- `load_draft(path, dtype)`: a checkpoint directory as the model it holds, `MtpHead` for an MTP
  head's config (`model.mtp_checkpoint.is_mtp_checkpoint`), `DFlash2DraftModel` otherwise (DFlash v1
  included), each refusing bad input in one line.
- `family_of(model)` -> "mtp" | "dflash2"; `kind(model)` -> "MTP head", "DFlash2" or "DFlash v1",
  what descriptions print.
- `target_head(files, dtype, block_size)`: the target's own MTP head (`head_from_target` on a
  local target directory), None when the target ships none.
"""
from __future__ import annotations

from pathlib import Path

import torch

from dflash2.model.draft import DFlash2DraftModel
from dflash2.model.mtp import MtpHead
from dflash2.model.mtp_checkpoint import head_from_target, is_mtp_checkpoint, load_mtp_head

FAMILIES = ("dflash2", "mtp")


def load_draft(path: str | Path, dtype: torch.dtype = torch.float32) -> DFlash2DraftModel | MtpHead:
    if is_mtp_checkpoint(path):
        return load_mtp_head(path, dtype)
    return DFlash2DraftModel.from_pretrained(path, dtype)


def family_of(model) -> str:
    return "mtp" if isinstance(model, MtpHead) else "dflash2"


def kind(model) -> str:
    if isinstance(model, MtpHead):
        return "MTP head"
    return "DFlash2" if model.config.is_dflash2 else "DFlash v1"


def target_head(files, dtype: torch.dtype = torch.float32, block_size: int = 8) -> MtpHead | None:
    """`files` a `targets.builtin.TargetFiles`."""
    if not Path(files.resolved).is_dir():
        return None
    head = head_from_target(files.resolved, files.config, block_size)
    return None if head is None else head.to(dtype)
