"""The draft factory: every fresh (untrained) draft is built, seeded and initialised here.

Contract:
- `create_draft(target_config, shape, mask_token_id=..., seed=0, final_norm_init=None)` returns a
  `DFlash2DraftModel` of `shape` for the Hugging Face `target_config` (`DFlash2Config.for_target`),
  in fp32 and training mode, not bound to a target. Its weights depend only on (config, seed):
  the global generator is seeded with `seed` before the modules are constructed, then
  `init_linear_weights(draft, seed)` draws every part from its own (seed, module name) stream
  (normal linears, unit norms, identity convolutions, neutral selector: docs/spec.md §2.3, §2.4),
  so drafts that differ only in their switched parts share every common weight.
- The global generator is left as construction leaves it (callers that draw next, e.g. the tiny
  test drafts' perturbation, depend on it).
- `final_norm_init` sets the final-norm weight: a fresh draft's hidden state is nearly its input
  token's embedding, so a unit final norm gives that token a very large logit and a first loss far
  above ln V; a small weight starts the draft near-uniform. None keeps the unit norm.
"""
from __future__ import annotations

from typing import Any

import torch

from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel, init_linear_weights
from dflash2.model.shape import DEFAULT_SHAPE, DraftShape


def create_draft(target_config: Any, shape: DraftShape = DEFAULT_SHAPE, *, mask_token_id: int, seed: int = 0,
                 final_norm_init: float | None = None) -> DFlash2DraftModel:
    config = DFlash2Config.for_target(target_config, shape, mask_token_id=mask_token_id)
    torch.manual_seed(seed)
    draft = DFlash2DraftModel(config)
    init_linear_weights(draft, seed=seed)
    if final_norm_init is not None:
        with torch.no_grad():
            draft.norm.weight.fill_(final_norm_init)
    return draft
