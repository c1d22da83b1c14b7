"""Draft shape: the one set of defaults for how a fresh draft is shaped (docs/spec.md §2.1).

Contract:
- `DraftShape` is a frozen dataclass of every choice that shapes a fresh draft for a target: layers,
  MLP width, attention shape, tapped target layers, block size, sliding window, the DFlash2 parts
  (convolutions, selector) and their sizes, and an optional reduced draft vocabulary. Its defaults are the published DFlash2 draft's
  (5 layers, block 8, window 2048, convs and selector on, selector rank 256 / top 16, conv groups
  of 16 channels). `None` means "take it from the target": the target's MLP width and attention
  shape; taps spread over the target's layers by the docs/spec.md §2.1 rule.
- Every producer of fresh drafts takes its defaults from here: `dflash2 init-draft`,
  `pipeline.new_draft`, `DFlash2Config.for_target`, the training config's `draft` section.
- `shape.attention(text_config)` resolves the attention shape against a target: unset heads are
  the target's; with the target's head count the KV heads and head size are the target's too, with
  a head count of one's own they default to plain multi-head attention of hidden / heads.
- `target_text_config(config)` is the text part of a Hugging Face config (multimodal configs nest it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def target_text_config(target_config: Any) -> Any:
    """The text-model config of a Hugging Face config (itself for plain causal LMs)."""
    return target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config


@dataclass(frozen=True)
class AttentionShape:
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


@dataclass(frozen=True)
class DraftShape:
    num_layers: int = 5
    intermediate_size: int | None = None          # None: the target's MLP width
    num_attention_heads: int | None = None        # None: the target's attention shape
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    num_taps: int | None = None                   # None: one tapped target layer per draft layer (at most L - 3)
    target_layer_ids: tuple[int, ...] | None = None  # None: `num_taps` layers spread from 1 to L - 3
    block_size: int = 8
    sliding_window: int = 2048
    use_conv: bool = True                         # two-tap grouped dynamic convolutions
    use_selector: bool = True                     # path selector over the top-K candidates
    selector_rank: int = 256
    selector_top_k: int = 16
    conv_group_size: int = 16
    draft_vocab_size: int | None = None           # None: the target's whole vocabulary (the published format)

    def attention(self, text_config: Any) -> AttentionShape:
        """This shape's attention heads, KV heads and head size for a target's text config."""
        heads = self.num_attention_heads or text_config.num_attention_heads
        own_heads = heads != text_config.num_attention_heads
        kv_heads = self.num_key_value_heads or (
            heads if own_heads else getattr(text_config, "num_key_value_heads", None) or heads)
        head_dim = self.head_dim or (None if self.num_attention_heads else getattr(text_config, "head_dim", None)) \
            or text_config.hidden_size // heads
        return AttentionShape(heads, kv_heads, head_dim)


DEFAULT_SHAPE = DraftShape()
