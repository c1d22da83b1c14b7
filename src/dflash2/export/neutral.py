"""The draft an engine gets: DFlash2 parts completed in their neutral form, or stripped for v1.

Contract:
- `for_dflash2(model)` returns a draft that has both DFlash2 parts. A part the draft lacks is
  added in its neutral form, which computes exactly what the draft without it computes:
  identity convolutions (base_kernel[:, 0, :] = 1, base_kernel[:, 1, :] = 0,
  kernel_projection = 0: y = x on both sides) and a zero selector (all pair scores 0, so the
  walk picks each position's arg-max draft token, the v1 pick; at T > 0 it samples from the
  draft's top-K, renormalised: other proposals, the same exact output distribution). The zero
  selector has rank `NEUTRAL_SELECTOR_RANK` (its values do not matter; a full-rank zero table
  would be 2 x V x r zeros). A DFlash v1 draft (neither part) is refused: its right form is
  `dflash-v1` (or `gguf`, which carries v1 drafts as they are).
- `for_dflash_v1(model)` returns the same backbone without convolutions and selector.
- Both return a `PartsChange` naming what was completed or dropped; the source model is never
  modified; shared tensors are copied exactly.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from dflash2.errors import DFlash2Error
from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel

NEUTRAL_SELECTOR_RANK = 16
CONVOLUTIONS = "convolutions (identity)"
SELECTOR = "selector (zero pair scores)"


@dataclass
class PartsChange:
    model: DFlash2DraftModel
    completed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def _rebuild(model: DFlash2DraftModel, config: DFlash2Config) -> DFlash2DraftModel:
    """A draft of `config` holding every tensor of `model` that it has too (same dtype)."""
    dtype = model.fc.weight.dtype
    new = DFlash2DraftModel(config).to(dtype)
    source = model.state_dict()
    kept = {name: source[name].detach().clone() for name in new.state_dict() if name in source}
    new.load_state_dict(kept, strict=False)
    return new.eval()


def dflash2_config(config: DFlash2Config) -> DFlash2Config:
    """The config of `config`'s draft completed to DFlash2 (raises a one-line error naming the right form)."""
    if not config.is_dflash2:
        raise DFlash2Error("draft is DFlash v1 (no convolutions, no selector): export it with --to dflash-v1 "
                           "(or --to gguf, which carries v1 drafts as they are)")
    if config.use_conv and config.use_selector:
        return config
    try:
        return dataclasses.replace(
            config, use_conv=True, use_selector=True,
            selector_rank=config.selector_rank if config.use_selector else NEUTRAL_SELECTOR_RANK)
    except DFlash2Error as err:
        raise DFlash2Error(f"cannot add the missing DFlash2 part in its neutral form ({err}); "
                           "export it with --to dflash-v1") from None


def for_dflash2(model: DFlash2DraftModel) -> PartsChange:
    config = model.config
    complete = dflash2_config(config)
    if complete is config:
        return PartsChange(model)
    new = _rebuild(model, complete)
    change = PartsChange(new)
    with torch.no_grad():
        if not config.use_conv:
            for layer in new.layers:
                layer.attention_conv.reset_parameters()  # the identity init is the neutral form
                layer.mlp_conv.reset_parameters()
            change.completed.append(CONVOLUTIONS)
        if not config.use_selector:
            for tensor in (new.candidate_selector.predecessor_codebook, new.candidate_selector.successor_codebook,
                           new.candidate_selector.hidden_projection.weight):
                tensor.zero_()
            change.completed.append(SELECTOR)
    return change


def full_vocabulary(model: DFlash2DraftModel) -> DFlash2DraftModel:
    """The same draft scoring the target's whole vocabulary (the d2t / t2d mapping dropped)."""
    return _rebuild(model, dataclasses.replace(model.config, draft_vocab_size=None))


def for_dflash_v1(model: DFlash2DraftModel) -> PartsChange:
    config = model.config
    if not config.is_dflash2:
        return PartsChange(model)
    dropped = (["convolutions"] if config.use_conv else []) + (["selector"] if config.use_selector else [])
    v1 = dataclasses.replace(config, use_conv=False, use_selector=False)
    return PartsChange(_rebuild(model, v1), dropped=dropped)

