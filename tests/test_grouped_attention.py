"""Grouped-query attention without copying the KV cache per query head (`targets.grouped_attention`).

The fold against attention over KV heads repeated per query head (the reference arithmetic), and
every grouped transformers family the engine runs: the verifier's passes (padded prefill, blocks,
roll-back, a second block, a token tree) give the same logits with the folded kernel as with
transformers' own `sdpa`, and the folded kernel really runs there. Whole-engine equality with
Hugging Face `generate()` for these families is in test_lossless_greedy.py / test_lossless_hybrid.py
/ test_tree.py, which now run through this kernel.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets import grouped_attention
from dflash2.targets.grouped_attention import fold_queries, folded_attention, stock_attention
from dflash2.targets.tiny import tiny_target

ROUNDING = 5e-5   # fp32: the fold sums the same products, SDPA blocks them differently per shape (measured <= 1.1e-5 on logits ~3)


def repeated_heads(q, k, v, mask):
    groups = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                          attn_mask=mask)


def test_which_passes_fold():
    shared = torch.ones(2, 1, 4, 9, dtype=torch.bool)
    assert fold_queries(None, 1, 3) == (True, None)                 # one query, no mask
    assert fold_queries(shared, 4, 1)[0] is False                    # no grouping
    assert fold_queries(None, 4, 3) == (False, None)                 # is_causal: queries in their order
    assert fold_queries(torch.ones(2, 3, 4, 9, dtype=torch.bool), 4, 3)[0] is False   # a per-head mask
    fold, mask = fold_queries(shared, 4, 3)
    assert fold and mask.shape == (2, 1, 12, 9)


@pytest.mark.parametrize("kind", ["bool", "additive", "none"])
def test_folded_attention_is_attention_over_repeated_heads(kind):
    torch.manual_seed(0)
    b, heads, kv_heads, length, slots, d = 3, 6, 2, 1 if kind == "none" else 5, 11, 8
    q, k, v = torch.randn(b, heads, length, d), torch.randn(b, kv_heads, slots, d), torch.randn(b, kv_heads, slots, d)
    visible = torch.rand(b, 1, length, slots) > 0.4
    visible[..., -1] = True                                         # every query sees something
    mask = {"bool": visible, "none": None,
            "additive": torch.zeros(b, 1, length, slots).masked_fill(~visible, torch.finfo(torch.float32).min)}[kind]
    fold, folded_mask = fold_queries(mask, length, heads // kv_heads)
    assert fold
    out = folded_attention(q, k, v, folded_mask, None)
    assert out.shape == (b, heads, length, d)
    assert (out - repeated_heads(q, k, v, mask)).abs().max() <= 1e-6


def _verifier_passes(adapter: TargetAdapter, trees: bool) -> list[torch.Tensor]:
    """A padded prefill, a block, a ragged roll-back, a second block and (where supported) a tree."""
    adapter.reset()
    logits = [adapter.prefill([[5, 9, 13, 7, 22, 31, 4], [8, 3, 17]])[0]]
    logits.append(adapter.step(torch.tensor([[11, 12, 13, 14, 15], [21, 22, 23, 24, 25]]))[0])
    adapter.keep(torch.tensor([2, 4]), 5)
    logits.append(adapter.step(torch.tensor([[40, 41, 42], [50, 51, 52]]))[0])
    adapter.keep(torch.tensor([3, 1]), 3)
    if trees and adapter.supports_trees:
        # anchor, then two branches from it: 0 -> 1 -> 2 and 0 -> 3
        depth = torch.tensor([[0, 1, 2, 1]] * 2)
        visible = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
        logits.append(adapter.step_tree(torch.tensor([[60, 61, 62, 63], [70, 71, 72, 73]]), depth,
                                        visible.expand(2, -1, -1))[0])
    return logits


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "qwen3_5", "qwen3_next"])
def test_transformers_targets_verify_the_same_through_the_fold(family, monkeypatch):
    model = tiny_target(family, num_layers=4)            # loaded for decoding: `kernels.use_kernels`
    adapter = TargetAdapter(model, [1, 3])
    assert model.config._attn_implementation == grouped_attention.NAME
    calls = []
    real = grouped_attention.folded_attention
    monkeypatch.setattr(grouped_attention, "folded_attention", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        folded = _verifier_passes(adapter, trees=True)
        assert calls, "the folded kernel never ran"
        calls.clear()
        with stock_attention(model):
            assert model.config._attn_implementation == "sdpa"
            stock = _verifier_passes(adapter, trees=True)
        assert not calls
    assert model.config._attn_implementation == grouped_attention.NAME
    assert len(folded) == len(stock) >= 3
    worst = max(float((mine - theirs).abs().max()) for mine, theirs in zip(folded, stock))
    print(f"{family}: largest logit difference {worst:.2e}")
    assert worst <= ROUNDING
    adapter.close()


def test_models_outside_sdpa_are_left_alone():
    model = tiny_target("qwen3", num_layers=2)
    model.set_attn_implementation("eager")
    assert grouped_attention.fold_transformers_attention(model) is False
    assert model.config._attn_implementation == "eager"
