"""Tiny random targets and drafts, for tests and smoke runs (no download, seconds on a CPU).

Contract: `tiny_target(family, vocab_size, seed)` builds a randomly initialised Hugging Face causal
LM of the given family ("llama", "qwen3", "gemma3"; Gemma3 with a short sliding window so that
window roll-back is exercised; the hybrids of `HYBRID_FAMILIES`: "qwen3_5", "qwen3_5_moe", "qwen3_next"
(Gated DeltaNet layers, three to one with full attention) and "lfm2" (short convolutions); also
"lfm2_moe", LFM2's convolutions with mixture-of-experts MLPs) in fp32,
eval mode, prepared for decoding (`kernels.use_kernels`). `tiny_config(family, ...)` is the config it builds. `tiny_draft(target, ...)` builds a matching
randomly initialised DFlash2 (or v1) draft (the draft factory, `model.factory.create_draft`) whose
convolutions and selector are perturbed away from their identity / neutral init, so every part of
the draft does real work. `TinyTokenizer(vocab_size)` is a character-level stand-in tokenizer for
them (no chat template).
"""
from __future__ import annotations

import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Lfm2Config, Lfm2MoeConfig,
                          Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3Config, Qwen3NextConfig)

from dflash2.model.draft import DFlash2DraftModel
from dflash2.model.factory import create_draft
from dflash2.model.shape import DraftShape
from dflash2.errors import require
from dflash2.targets.kernels import use_kernels

HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "lfm2")
FAMILIES = ("llama", "qwen3", "gemma3") + HYBRID_FAMILIES + ("lfm2_moe",)


def tiny_config(family: str = "llama", vocab_size: int = 128, num_layers: int = 6, hidden_size: int = 64,
                sliding_window: int = 12):
    require(family in FAMILIES, f"unknown tiny family '{family}' (choose from {', '.join(FAMILIES)})")
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    # Gated DeltaNet: 4 value heads sharing 2 key heads (grouped), width-4 conv; every fourth layer attends
    linear = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                  linear_conv_kernel_dim=4, head_dim=16,
                  layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)])
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden_size // 2,
                   shared_expert_intermediate_size=hidden_size // 2)
    if family == "llama":
        return LlamaConfig(**common, tie_word_embeddings=True)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=16, tie_word_embeddings=False)
    if family == "gemma3":
        layer_types = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(num_layers)]
        return Gemma3TextConfig(**common, head_dim=16, sliding_window=sliding_window, layer_types=layer_types,
                                query_pre_attn_scalar=16)
    if family == "qwen3_5":
        return Qwen3_5TextConfig(**common, **linear, tie_word_embeddings=False)
    if family == "qwen3_5_moe":
        return Qwen3_5MoeTextConfig(**common, **linear, **experts, tie_word_embeddings=False)
    if family == "qwen3_next":
        return Qwen3NextConfig(**common, **linear, **experts, tie_word_embeddings=False)
    if family == "lfm2_moe":
        return Lfm2MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden_size // 2,
                             num_dense_layers=1, conv_L_cache=3,
                             layer_types=["full_attention" if i % 3 == 2 else "conv" for i in range(num_layers)])
    return Lfm2Config(**common, full_attn_idxs=[i for i in range(num_layers) if i % 3 == 2], conv_L_cache=3)


def tiny_target(family: str = "llama", vocab_size: int = 128, seed: int = 0, num_layers: int = 6,
                hidden_size: int = 64, sliding_window: int = 12):
    config = tiny_config(family, vocab_size, num_layers, hidden_size, sliding_window)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger-than-default weights give peaked, varied next-token distributions
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.25)
    return use_kernels(model.eval())


def tiny_draft(target, *, block_size: int = 8, num_layers: int = 2, use_conv: bool = True,
               use_selector: bool = True, seed: int = 0, top_k: int = 8,
               draft_vocab_size: int | None = None) -> DFlash2DraftModel:
    shape = DraftShape(num_layers=num_layers, num_taps=3, block_size=block_size, use_conv=use_conv,
                       use_selector=use_selector, selector_rank=16, selector_top_k=top_k, conv_group_size=16,
                       sliding_window=64, draft_vocab_size=draft_vocab_size)
    draft = create_draft(target.config, shape, mask_token_id=target.config.vocab_size - 1, seed=seed)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if "base_kernel" in name or "kernel_projection" in name or "codebook" in name:
                param.add_(0.1 * torch.randn_like(param))
    if draft_vocab_size is not None:  # a random subset: some target tokens can never be drafted
        generator = torch.Generator().manual_seed(seed + 1)
        draft.set_draft_vocabulary(torch.randperm(target.config.vocab_size, generator=generator)[:draft_vocab_size])
    return draft.eval()


class TinyTokenizer:
    """Character-level stand-in for a real tokenizer, for the random tiny models (no chat template).

    Ids 0-2 are pad / BOS / EOS; characters map into 3..vocab_size-2 (the last id is the draft's
    MASK). Prompts are cut to `max_chars` characters so tiny runs stay fast.
    """

    chat_template = None
    eos_token_id = 2
    pad_token_id = 0

    def __init__(self, vocab_size: int, max_chars: int = 40):
        self.span = vocab_size - 4
        self.max_chars = max_chars

    def __call__(self, text: str, truncation: bool = False, max_length: int | None = None,
                 add_special_tokens: bool = True) -> dict:
        ids = [1] * add_special_tokens + [3 + ord(c) % self.span for c in text[-self.max_chars:]]
        return {"input_ids": ids[:max_length] if truncation and max_length is not None else ids}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + (int(i) - 3) % 26) for i in ids if not (skip_special_tokens and int(i) < 3))
