"""A Llama-architecture causal LM in plain torch, for targets whose start-up must be short.

Contract:
- `supports(config_dict)`: whether a target's `config.json` (as a dict) is a Llama this module
  computes exactly as transformers' `LlamaForCausalLM` does: model_type `llama`, SiLU MLP without
  biases, attention without biases, default RoPE (no scaling), one tensor-parallel slice. SmolLM2
  (the default built-in target) is one. Anything else loads through transformers.
- `LlamaTargetConfig.from_json(path)`: the config as a transformers `PreTrainedConfig` of model
  type `llama`, built without importing transformers' Llama modules (their import chain costs
  1.5-2 s of every start). It holds the same fields and the same `to_dict()` as transformers'
  `LlamaConfig` for the same file, so data fingerprints (`training.data_identity.config_sha256`) and
  stored calibrations are unchanged.
- `LlamaCausalLM.from_pretrained(directory, config, dtype, device)`: the model, built on the meta
  device and given the safetensors weights (tied LM head where the config says so), in eval mode.
  Parameter names, hence `state_dict()`, are transformers'. The call interface is the part of
  transformers' that `decoding.verifier.adapter.TargetAdapter` and training use: `model(input_ids,
  attention_mask, position_ids, past_key_values, use_cache, logits_to_keep)` -> `.logits`;
  `get_decoder()(...)` (`.layers`, the hooks' targets); a `transformers.cache_utils` cache is
  updated layer by layer as transformers does (the engine's `SlotLayer`s included). A 2-D
  attention mask [b, slots] (1 = real token) is combined with causality in slot order, exactly
  like transformers' `create_causal_mask`; a 4-D mask (token trees) is used as given.
- The arithmetic is transformers' step by step (RMSNorm in fp32, RoPE from fp32 frequencies,
  `scaled_dot_product_attention` on the KV heads themselves, each one's query heads folded onto it
  (`targets.grouped_attention`: every pass of the engine; repeated KV heads only for an unmasked
  pass without a cache)), so fp32 logits agree to rounding (tests/test_llama_target.py: logits, greedy output and
  the engine's lossless run against transformers' own class; within 1.2e-5 in the cases measured,
  where transformers repeats the KV heads). What differs is how, not what: Q, K and V (and gate and
  up) run as one matmul each, and on the CPU on prepacked oneDNN weights where that gives the same
  bits or a verify pass's rounding only (`model.projections`: the plain step at float32 and every
  pass at bfloat16 up to 32 rows are bit for bit transformers' `F.linear`); RoPE rotates Q and K
  in one go; a boolean mask becomes additive once per pass instead of once per layer. The LM head
  stays an op of its own (`self.head`, over `lm_head`'s weight).
  There is no `generate()`: code that needs Hugging Face generation (the `hf_*` bench peers) asks `open_target(..., implementation="transformers")`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from transformers.configuration_utils import PreTrainedConfig

from dflash2.errors import require
from dflash2.model.draft import RMSNorm as DraftRMSNorm
from dflash2.model.swiglu import SwiGLU
from dflash2.targets import exact_attention
from dflash2.targets.grouped_attention import fold_queries, folded_attention, like_queries
from dflash2.model.projections import Fusing, Projection


def supports(config: dict) -> bool:
    """True for a Llama config this module computes exactly as transformers does."""
    rope = config.get("rope_parameters") or {}
    return (config.get("model_type") == "llama"
            and config.get("architectures", ["LlamaForCausalLM"]) == ["LlamaForCausalLM"]
            and config.get("hidden_act", "silu") == "silu"
            and not config.get("attention_bias", False) and not config.get("mlp_bias", False)
            and config.get("pretraining_tp", 1) == 1
            and not config.get("rope_scaling")
            and rope.get("rope_type", "default") == "default" and set(rope) <= {"rope_type", "rope_theta"}
            and not config.get("quantization_config"))


class LlamaTargetConfig(PreTrainedConfig):
    """transformers' `LlamaConfig` fields, read from a converted `config.json` that lists them all."""

    model_type = "llama"

    def __init__(self, use_cache: bool = True, **fields):
        super().__init__(**fields)
        self.use_cache = use_cache  # a Llama field the base class does not keep

    @classmethod
    def from_json(cls, path: str | Path) -> "LlamaTargetConfig":
        directory = Path(path)
        config = cls.from_dict(json.loads((directory / "config.json").read_text(encoding="utf-8")))
        config._name_or_path = str(path)
        return config

    @property
    def rope_theta(self) -> float:
        return float((getattr(self, "rope_parameters", None) or {}).get("rope_theta", 10000.0))

    @property
    def attention_head_dim(self) -> int:
        return getattr(self, "head_dim", None) or self.hidden_size // self.num_attention_heads


@dataclass
class CausalLMOutput:
    logits: torch.Tensor | None
    last_hidden_state: torch.Tensor
    past_key_values: object | None


class Embedding(nn.Module):
    """`nn.Embedding` without its random init: this model is built on the meta device only to be
    loaded, and `normal_` on meta tensors imports torch._dynamo (a second of start-up)."""

    def __init__(self, rows: int, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(DraftRMSNorm):
    """transformers' Llama rule, which casts back to the input's dtype before the weight multiplies
    (the draft's casts after it): the same in fp32, not in bf16."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm without a weight is x * rsqrt(mean(x^2) + eps), the same operations in one call
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        # device="cpu": a real tensor even while the model is built under torch.device("meta")
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        inv_freq = 1.0 / (theta ** exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [b, L] -> cos, sin [b, 1, L, head_dim] in x's dtype, sin's first half negated
        (what `_rope` multiplies the halves of x swapped by)."""
        inv = self.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)   # [b, d/2, 1]
        freqs = (inv @ positions[:, None, :].float()).transpose(1, 2)                   # [b, L, d/2]
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos[:, None], sin[:, None]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, L, d]; cos, sin [b, 1, L, d] from `Rotary`. transformers' x * cos +
    rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1): the same products, as roll(x) = cat(x2, x1)
    times sin with its first half negated (negation is exact)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


class Attention(Fusing):
    def __init__(self, config: LlamaTargetConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.attention_head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)
        self.qkv, self.out = Projection(self.q_proj, self.k_proj, self.v_proj), Projection(self.o_proj)
        self.refresh_projections()

    def projections(self) -> list[Projection]:
        return [self.qkv, self.out]

    def forward(self, x, cos, sin, mask, cache, fold: bool):
        """fold: the query heads fold onto their KV heads (`fold_queries`), `mask` already folded."""
        b, length, _ = x.shape
        heads, rotated = self.heads, self.heads + self.kv_heads
        # [b, L, (heads + 2 kv_heads) * d] -> [b, heads + 2 kv_heads, L, d]: q heads, k heads, v heads
        qkv = self.qkv(x).view(b, length, -1, self.head_dim).transpose(1, 2)
        qk = _rope(qkv[:, :rotated], cos, sin)                  # q and k rotated together
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, rotated:]
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)           # [b, kv_heads, slots, d]
        groups = self.heads // self.kv_heads
        if fold or exact_attention.active():   # the cache read where it lies, not copied per query head (~10x the attention at batch 20)
            out = folded_attention(q, k, v, mask, self.scaling)
        else:                      # a per-head mask; or no cache and no padding (`is_causal`: queries in their order)
            k, v = like_queries(q, k, v)
            if groups > 1:                                       # [b, kv_heads, S, d] -> [b, heads, S, d]
                k = k[:, :, None].expand(-1, -1, groups, -1, -1).reshape(b, self.heads, -1, self.head_dim)
                v = v[:, :, None].expand(-1, -1, groups, -1, -1).reshape(b, self.heads, -1, self.head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                                 is_causal=mask is None and length > 1)  # only without a cache
        out = out.reshape(b, self.heads, length, self.head_dim)                        # [b, heads, L, d]
        return self.out(out.transpose(1, 2).reshape(b, length, -1))                      # [b, L, heads * d]


class MLP(SwiGLU, Fusing):
    """`SwiGLU` with gate and up in one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__(hidden_size, intermediate_size)
        self.gate_up, self.down = Projection(self.gate_proj, self.up_proj), Projection(self.down_proj)
        self.refresh_projections()

    def projections(self) -> list[Projection]:
        return [self.gate_up, self.down]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.gate_up.sizes, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaTargetConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache, fold: bool):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, fold)
        return x + self.mlp(self.post_attention_layernorm(x))


def causal_mask(attention_mask: torch.Tensor | None, length: int, past: int, device) -> torch.Tensor | None:
    """transformers' rule in slot order: query i (slot past + i) sees slot j when j <= past + i and
    attention_mask[:, j] is 1. attention_mask [b, past + length] -> bool [b, 1, length, past + length];
    None where attention needs no mask (transformers skips it there too): one query and no padding
    (it sees every slot), or no cache and no padding (`is_causal`)."""
    padded = attention_mask is not None and not bool(attention_mask.all())
    if not padded and (length == 1 or past == 0):
        return None
    slots = past + length
    require(attention_mask is None or attention_mask.shape[1] == slots,
            f"attention mask covers {attention_mask.shape[1] if attention_mask is not None else 0} slots, "
            f"the cache and the input {slots}")
    causal = torch.arange(slots, device=device)[None, :] <= (past + torch.arange(length, device=device))[:, None]
    if not padded:
        return causal[None, None]                                            # [1, 1, L, S]
    return (causal[None] & attention_mask.bool()[:, None, :])[:, None]      # [b, 1, L, S]


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaTargetConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = Rotary(config.attention_head_dim, config.rope_theta)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None, use_cache: bool | None = None,
                **_unused) -> CausalLMOutput:
        x = self.embed_tokens(input_ids)                                        # [b, L, H]
        length = input_ids.shape[1]
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(length, device=x.device) + past)[None].expand(input_ids.shape[0], -1)
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask                                               # as given (token trees)
        else:
            mask = causal_mask(attention_mask, length, past, x.device)
        fold, mask = fold_queries(mask, length, self.config.num_attention_heads // self.config.num_key_value_heads)
        if mask is not None and mask.dtype == torch.bool:   # made additive once, not by every layer's sdpa
            mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, past_key_values, fold)
        return CausalLMOutput(None, self.norm(x), past_key_values)


class LlamaCausalLM(Fusing):
    quantizable = False                               # its projection is the LM head

    def __init__(self, config: LlamaTargetConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.head = Projection(self.lm_head)          # a separate op of its own (packed on CPU)
        self.refresh_projections()

    def projections(self) -> list[Projection]:
        return [self.head]

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def get_decoder(self) -> LlamaModel:
        return self.model

    def get_input_embeddings(self) -> Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None, use_cache: bool | None = None,
                logits_to_keep: int = 0, **_unused) -> CausalLMOutput:
        out = self.model(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return CausalLMOutput(self.head(hidden), out.last_hidden_state, past_key_values)

    @classmethod
    def from_pretrained(cls, directory: str | Path, config: LlamaTargetConfig, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> "LlamaCausalLM":
        """Built on the meta device, then given the weights of every `*.safetensors` in `directory`."""
        with torch.device("meta"):
            model = cls(config)
        weights: dict[str, torch.Tensor] = {}
        for path in sorted(Path(directory).glob("*.safetensors")):
            weights.update(load_file(str(path), device=str(device)))
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        for name in tied:
            weights.pop(name, None)                    # a tied head is the embedding: one tensor
        expected = set(model.state_dict()) - tied
        missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
        require(not missing and not unexpected,
                f"{directory}: the weights do not match a Llama of this config (missing {missing[:3]}, "
                f"unexpected {unexpected[:3]})")
        model.load_state_dict({name: tensor.to(dtype) for name, tensor in weights.items()}, assign=True,
                              strict=not tied)
        if tied:
            model.lm_head.weight = model.model.embed_tokens.weight
            model.refresh_projections()
        model.model.rotary_emb.to(device)
        return model.eval()
