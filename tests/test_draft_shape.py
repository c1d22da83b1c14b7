"""One set of draft-shape defaults (the published shape) behind every fresh draft, and one factory."""
from __future__ import annotations

import dataclasses

import torch

from dflash2.cli import build_parser
from dflash2.model.config import DFlash2Config
from dflash2.model.factory import create_draft
from dflash2.model.shape import DEFAULT_SHAPE, DraftShape
from dflash2.pipeline import new_draft
from dflash2.targets.tiny import tiny_target
from dflash2.training.config import TrainConfig


class _Tokenizer:
    mask_token_id = None

    def get_added_vocab(self):
        return {"<mask>": 100}


def test_defaults_are_the_published_shape():
    s = DEFAULT_SHAPE
    assert (s.num_layers, s.block_size, s.sliding_window, s.selector_rank, s.selector_top_k, s.conv_group_size) \
        == (5, 8, 2048, 256, 16, 16)
    assert s.use_conv and s.use_selector and s.intermediate_size is None and s.target_layer_ids is None


def test_every_producer_takes_the_same_defaults():
    assert TrainConfig().draft.shape() == DEFAULT_SHAPE
    args = build_parser().parse_args(["init-draft", "--target", "t", "--out", "o"])
    assert (args.layers, args.block_size, args.selector_rank, args.selector_top_k, args.intermediate_size) == (
        DEFAULT_SHAPE.num_layers, DEFAULT_SHAPE.block_size, DEFAULT_SHAPE.selector_rank,
        DEFAULT_SHAPE.selector_top_k, DEFAULT_SHAPE.intermediate_size)
    assert not args.no_conv and not args.no_selector
    target = tiny_target("qwen3", num_layers=8)
    config = DFlash2Config.for_target(target.config, mask_token_id=100)
    assert config.to_dict() == DFlash2Config.for_target(target.config, DEFAULT_SHAPE, mask_token_id=100).to_dict()
    assert (config.num_hidden_layers, config.selector_rank, config.block_size, config.sliding_window) == (5, 256, 8, 2048)
    assert config.target_layer_ids == [1, 2, 3, 4, 5]                  # min(5, L - 3) taps spread over 1..L-3
    pipeline_draft = new_draft(target.config, _Tokenizer())
    assert pipeline_draft.config.to_dict() == config.to_dict() and not pipeline_draft.training


def test_factory_is_seeded_and_shared():
    target = tiny_target("llama")
    shape = DraftShape(num_layers=2, selector_rank=8)
    a = create_draft(target.config, shape, mask_token_id=100, seed=3)
    b = new_draft(target.config, _Tokenizer(), shape, seed=3)
    c = create_draft(target.config, dataclasses.replace(shape, use_selector=False), mask_token_id=100, seed=3,
                     final_norm_init=0.5)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
        if "candidate_selector" not in name and name != "norm.weight":
            assert torch.equal(tensor, c.state_dict()[name]), name   # parts share weights across arms
    assert torch.equal(c.norm.weight, torch.full_like(c.norm.weight, 0.5))
    assert not torch.equal(a.fc.weight, create_draft(target.config, shape, mask_token_id=100, seed=4).fc.weight)


def test_attention_shape_of_ones_own_or_the_targets():
    text = tiny_target("qwen3").config                                 # 4 heads, 2 KV heads, head_dim 16, hidden 64
    own = DraftShape(num_attention_heads=8).attention(text)
    assert (own.num_attention_heads, own.num_key_value_heads, own.head_dim) == (8, 8, 8)
    same = DraftShape().attention(text)
    assert (same.num_attention_heads, same.num_key_value_heads, same.head_dim) == (4, 2, 16)
