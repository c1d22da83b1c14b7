"""Grouped-query attention that reads the KV cache where it lies, for every target the engine runs.

Contract:
- `fold_queries(mask, length, groups)` decides whether a pass of `length` queries folds each KV
  head's `groups` query heads onto it, and returns the mask to attend with (rows repeated per query
  head, [b, 1, L, S] -> [b, 1, groups * L, S]). Folded: grouped heads with one query, or with a
  mask shared by all heads. Not folded: no grouping, a per-head mask, or no mask with several
  queries (`is_causal`, where the kernel needs the queries in their order).
- `folded_attention(q, k, v, mask, scale)`: q [b, heads, L, d], k and v [b, kv_heads, S, d], `mask`
  from `fold_queries` -> [b, heads, L, d]. The same dot products and sums as attention over KV
  heads repeated per query head, without the repeat: verification passes of a block (or a tree)
  otherwise copy the whole cache once per query head in every layer, which costs more than the
  attention itself at batch 8 and above.
- `fold_transformers_attention(model)`: a transformers-loaded model whose attention runs on `sdpa`
  is switched to `"folded_gqa"` — transformers' own sdpa masks, this module's kernel for the
  passes `fold_queries` folds and transformers' `sdpa_attention_forward` for every other call
  (dropout in training, logit soft-capping, attention sinks, position biases, encoders). Other
  implementations (eager, flash, flex) are left as they are. Returns whether it switched.
  `kernels.use_kernels` does this to every target as it loads.
- Inside `exact_attention.exact()` every pass these kernels take (and the unfolded ones of a
  plain transformers model), one-token steps included, runs `exact_attention.attend`, which gives
  each query the bits it gets in a one-token step (`--exact-verify`).
- `stock_attention(model)`: a context in which such a model runs transformers' own `sdpa` again
  (the Hugging Face peers of `bench` are measured as Hugging Face ships them).
The built-in Llama (`targets.llama`) folds through the first two functions itself.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from dflash2.targets import exact_attention

NAME = "folded_gqa"   # no "flash" in it: transformers takes such names for flash-attention kernels


def fold_queries(mask: torch.Tensor | None, length: int, groups: int) -> tuple[bool, torch.Tensor | None]:
    """Whether to fold (see the module's contract) and the mask to attend with."""
    fold = groups > 1 and (length == 1 or mask is not None) and (mask is None or mask.shape[1] == 1)
    if fold and mask is not None and length > 1:
        # [b, 1, L, S] -> [b, 1, groups * L, S]: row g * L + l is query l of the group's head g
        mask = mask[:, :, None].expand(-1, -1, groups, -1, -1).reshape(mask.shape[0], 1, groups * length, -1)
    return fold, mask


def like_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v in q's dtype: `--exact-verify`'s float32 cache read by a pass outside exact mode (its
    prefill) goes back to the model's dtype, exactly (the cache holds that dtype's values)."""
    if k.dtype == q.dtype:
        return k, v
    return k.to(q.dtype), v.to(q.dtype)


def folded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float | None) -> torch.Tensor:
    """Attention of q [b, heads, L, d] over k, v [b, kv_heads, S, d] -> [b, heads, L, d]."""
    b, heads, length, d = q.shape
    if exact_attention.active():      # --exact-verify: one-token steps and verify passes alike
        return exact_attention.attend(q, k, v, mask, scale)
    k, v = like_queries(q, k, v)
    kv_heads = k.shape[1]
    # [b, heads, L, d] -> [b, kv_heads, groups * L, d]: head (kv * groups + g)'s query l becomes
    # query g * L + l of KV head kv
    q = q.reshape(b, kv_heads, heads // kv_heads * length, d)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, heads, length, v.shape[-1])


def _transformers_kernel(module, query, key, value, attention_mask, dropout: float = 0.0,
                         scaling: float | None = None, **kwargs):
    """transformers' attention-function interface: returns ([b, L, heads, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = (dropout == 0.0 and kwargs.get("softcap") is None and kwargs.get("s_aux") is None
             and kwargs.get("position_bias") is None and key.shape[-1] == value.shape[-1])
    fold, mask = fold_queries(attention_mask, query.shape[2], groups) if plain else (False, None)
    if plain and exact_attention.active():      # --exact-verify: each query as in a one-token step
        fold, mask = True, attention_mask
    if not fold:
        key, value = like_queries(query, key, value)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = folded_attention(query, key, value, mask, scaling)                   # [b, heads, L, d]
    return out.transpose(1, 2).contiguous(), None                              # [b, L, heads, d]


def fold_transformers_attention(model) -> bool:
    """Switch a transformers model from `sdpa` to this module's kernel (see the contract)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, _transformers_kernel)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)      # the masks sdpa would get
    try:
        model.set_attn_implementation(NAME)
    except ValueError:     # a model class with its own sdpa code, outside the attention interface
        return False
    return True


@contextlib.contextmanager
def stock_attention(model):
    """Run a model switched by `fold_transformers_attention` on transformers' `sdpa` inside the block."""
    switched = getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME
    if switched:
        model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        if switched:
            model.set_attn_implementation(NAME)
