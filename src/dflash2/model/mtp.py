"""A multi-token-prediction (MTP) head: the one-layer drafter of DeepSeek-V3 / Qwen3-Next / Qwen3.5.

Contract:
- `MtpConfig` is a head's `config.json` (`architectures: ["DFlash2MtpHead"]`): the target's text
  config (`text_config`, the Hugging Face `to_dict()`), `block_size` (the verify width: the anchor
  and k = block_size - 1 proposed tokens), the tapped target layer (`target_layer_ids`, the last
  decoder layer) and where the weights came from (`origin`: "fresh", "target": the target's own
  `mtp.*` tensors, "trained"). It answers the questions the engine, the pipeline and the trainer
  ask of a draft's config (`block_size`, `target_layer_ids`, `validate_against_target`, no
  selector, the target's vocabulary) so an MTP head goes wherever a draft goes.
- `MtpHead(config)` owns exactly the tensors of the published layout (Qwen3-Next / Qwen3.5
  checkpoints' `mtp.*` without the prefix): `pre_fc_norm_embedding`, `pre_fc_norm_hidden`,
  `fc` [H, 2H] (input: the normed embedding, then the normed hidden state), `layers.0` (one
  full-attention decoder layer of the target's own family, built from transformers' class for that
  family, so gated attention, partial rotary, zero-centred norms and MoE MLPs are the target's)
  and `norm` (the head's final norm). It has no embedding and no LM head: `bind_target` borrows
  the target's, like a DFlash draft (never saved). Families: `SUPPORTED_FAMILIES`.
- One MTP step at position p reads h = the target's final-norm hidden state at p - 1 (or, in the
  recursion, the head's own output at p - 1) and the token at p: `fuse(h, ids)` -> the layer input;
  `run_layer(x, positions, cache, mask)` -> the head's output (after `norm`), which predicts the
  token at p + 1 through `logits`. `cache` is a `KVSplice`: attention runs over its `past` keys and
  values and the new ones, which it records (`new`), so callers keep the head's KV cache themselves.
- `create_mtp_head(target_config, block_size, seed)`: a fresh head (normal(0, 0.02) matrices, unit
  norms) in fp32, training mode; `warm_start_from_target(head, target_model)` copies the target's
  last full-attention layer and final norm into it where shapes match.
- `target_final_norm(model)`: the target's final norm, which the head's inputs pass through.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dflash2.errors import DFlash2Error, require
from dflash2.model.draft import _Borrowed
from dflash2.model.shape import target_text_config

MTP_ARCH = "DFlash2MtpHead"
MTP_MODEL_TYPE = "dflash2_mtp"
SUPPORTED_FAMILIES = ("llama", "qwen3", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
ORIGINS = ("fresh", "target", "trained")


@dataclasses.dataclass
class MtpConfig:
    text_config: dict
    block_size: int = 8
    mask_token_id: int = 0                        # unused by the head; training batches carry one
    target_layer_ids: list[int] | None = None     # None: the target's last decoder layer
    origin: str = "fresh"

    def __post_init__(self) -> None:
        require(isinstance(self.text_config, dict), "MTP config field 'text_config' must be an object")
        family = self.text_config.get("model_type")
        require(family in SUPPORTED_FAMILIES, f"MTP heads are built for the target families "
                f"{', '.join(SUPPORTED_FAMILIES)}; this target is '{family}'")
        for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
            value = self.text_config.get(key)
            require(isinstance(value, int) and value > 0, f"MTP config field 'text_config.{key}' must be a positive integer")
        require(isinstance(self.block_size, int) and self.block_size >= 2,
                f"MTP config field 'block_size' must be an integer >= 2, got {self.block_size!r}")
        if self.target_layer_ids is None:
            self.target_layer_ids = [self.num_target_layers - 1]
        require(list(self.target_layer_ids) == [self.num_target_layers - 1],
                f"MTP config field 'target_layer_ids' must be [{self.num_target_layers - 1}] (the last layer)")
        require(self.origin in ORIGINS, f"MTP config field 'origin' must be one of {', '.join(ORIGINS)}")

    # what the engine, pipeline and trainer read of a draft's config
    hidden_size = property(lambda self: self.text_config["hidden_size"])
    target_hidden_size = hidden_size
    vocab_size = property(lambda self: self.text_config["vocab_size"])
    num_target_layers = property(lambda self: self.text_config["num_hidden_layers"])
    family = property(lambda self: self.text_config["model_type"])
    sliding_window = None
    use_selector = use_conv = is_dflash2 = False
    draft_vocab_size = final_logit_softcapping = None
    output_multiplier = 1.0

    @classmethod
    def for_target(cls, target_config: Any, block_size: int = 8, mask_token_id: int = 0,
                   origin: str = "fresh") -> "MtpConfig":
        return cls(_plain_dict(target_text_config(target_config)), block_size, mask_token_id, None, origin)

    def validate_against_target(self, target_config: Any) -> None:
        text = target_text_config(target_config)
        mine = (self.family, self.hidden_size, self.vocab_size, self.num_target_layers)
        theirs = (getattr(text, "model_type", None), text.hidden_size, text.vocab_size, text.num_hidden_layers)
        require(mine == theirs, f"MTP head/target mismatch: the head was made for a {mine[0]} target with hidden "
                f"size {mine[1]}, vocab {mine[2]}, {mine[3]} layers; this target is {theirs[0]} with {theirs[1]}, "
                f"{theirs[2]}, {theirs[3]}")

    def to_dict(self) -> dict:
        return {"architectures": [MTP_ARCH], "model_type": MTP_MODEL_TYPE, "block_size": self.block_size,
                "mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids),
                "origin": self.origin, "text_config": self.text_config}

    @classmethod
    def from_dict(cls, raw: dict) -> "MtpConfig":
        require(raw.get("architectures") == [MTP_ARCH], f"not an MTP head config (architectures must be [{MTP_ARCH}])")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known - {"architectures", "model_type"})
        require(not unknown, f"MTP config has unknown field '{unknown[0]}'" if unknown else "")
        require("text_config" in raw, "MTP config has no 'text_config'")
        return cls(**{k: v for k, v in raw.items() if k in known})

    def layer_config(self):
        """The transformers config of the head's one layer: the target's, one full-attention layer."""
        from transformers import CONFIG_MAPPING

        fields = {**self.text_config, "num_hidden_layers": 1, "layer_types": ["full_attention"]}
        config = CONFIG_MAPPING[self.family](**fields)
        config._attn_implementation = "sdpa"
        return config


def _plain_dict(text_config: Any) -> dict:
    """A config as the JSON object config.json stores (so it reads back equal)."""
    raw = json.loads(text_config.to_json_string(use_diff=False)) if hasattr(text_config, "to_json_string") \
        else json.loads(json.dumps(dict(text_config)))
    raw = {k: v for k, v in raw.items() if not k.startswith("_")}
    raw.setdefault("model_type", getattr(text_config, "model_type", None))
    return raw


class KVSplice:
    """transformers' cache interface for one layer (`update`): the attention sees `past` (K, V
    [b, kv_heads, S, d], or None) followed by the new keys and values, which are kept in `new`."""

    def __init__(self, past: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.past = past
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.new = (key_states, value_states)
        if self.past is None:
            return key_states, value_states
        return torch.cat([self.past[0], key_states], dim=2), torch.cat([self.past[1], value_states], dim=2)


def _family_classes(layer_config):
    """(decoder layer, RMS norm, rotary embedding) classes of the config's family, read from its base
    model built on the meta device (no memory)."""
    from transformers import AutoModel

    with torch.device("meta"):
        base = AutoModel.from_config(layer_config)
    return type(base.layers[0]), type(base.norm), type(base.rotary_emb)


class MtpHead(nn.Module):
    def __init__(self, config: MtpConfig):
        super().__init__()
        self.config = config
        layer_config = config.layer_config()
        layer_class, norm_class, rotary_class = _family_classes(layer_config)
        h, eps = config.hidden_size, layer_config.rms_norm_eps
        self.pre_fc_norm_embedding = norm_class(h, eps=eps)
        self.pre_fc_norm_hidden = norm_class(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([layer_class(layer_config, 0)])
        self.norm = norm_class(h, eps=eps)
        # kept outside the module tree: casting the head (bf16) must not round the rotary frequencies
        self.__dict__["_rotary"] = rotary_class(config=layer_config)
        self.register_buffer("embed_weight", None, persistent=False)      # [V, H], bound by bind_target
        self.register_buffer("lm_head_weight", None, persistent=False)   # [V, H]
        self._borrowed: _Borrowed | None = None

    # ------------------------------------------------------------------ what a draft offers
    selector = None
    reduced_vocabulary = False

    def bind_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Borrow the target's (frozen) embedding table and LM head; never saved."""
        shape = (self.config.vocab_size, self.config.hidden_size)
        require(tuple(embed_weight.shape) == shape, f"MTP head/target mismatch: target embedding is "
                                                    f"{tuple(embed_weight.shape)}, the head expects {shape}")
        dtype = self.fc.weight.dtype
        self._borrowed = _Borrowed(embed_weight.detach(), lm_head_weight.detach(), lm_head_weight is embed_weight)
        self.embed_weight = embed_weight.detach().to(dtype)
        self.lm_head_weight = self.embed_weight if self._borrowed.tied else lm_head_weight.detach().to(dtype)

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        if self._borrowed is not None:
            self._borrowed.share_into(self._buffers)
        return self

    @property
    def head_weight(self) -> torch.Tensor:
        return self.lm_head_weight

    def target_to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ forward pieces
    def fuse(self, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] (the target's final-norm state, or the head's own output), ids [...] -> [..., H]."""
        require(self.embed_weight is not None, "MTP head is not bound to a target: call bind_target first")
        dtype = self.fc.weight.dtype
        embedded = self.pre_fc_norm_embedding(F.embedding(ids, self.embed_weight).to(dtype))
        return self.fc(torch.cat([embedded, self.pre_fc_norm_hidden(hidden.to(dtype))], dim=-1))

    def run_layer(self, x: torch.Tensor, positions: torch.Tensor, cache: KVSplice,
                  mask: torch.Tensor) -> torch.Tensor:
        """x [b, q, H] at positions [b, q], attending `cache.past` and themselves as `mask` [b, 1, q,
        S + q] (True = visible) allows -> the head's output [b, q, H] (after its final norm)."""
        rotary = self.__dict__["_rotary"]
        if rotary.inv_freq.device != x.device:
            rotary.to(x.device)
        cos, sin = rotary(x.float(), positions)
        out = self.layers[0](x, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             position_embeddings=(cos.to(x.dtype), sin.to(x.dtype)))
        return self.norm(out[0] if isinstance(out, tuple) else out)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> fp32 logits [..., V] (2-D matmul: see `DFlash2DraftModel.logits`)."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return F.linear(flat, self.head_weight.to(hidden.dtype)).float().view(*hidden.shape[:-1], -1)


def target_final_norm(model) -> nn.Module:
    """The target's final norm (the MTP head reads the target's hidden state after it)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    norm = getattr(decoder, "norm", None)
    require(isinstance(norm, nn.Module), f"target {type(model).__name__} has no final norm the MTP head can read")
    return norm


def init_weights(head: MtpHead, seed: int, std: float = 0.02) -> None:
    """Every matrix (and MoE expert tensor) normal(0, std), `fc` at unit output variance; vectors
    as their modules made them (norms at identity); zeros for any other vector."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if param.dim() >= 2:
                scale = 1.0 / (param.shape[-1] ** 0.5) if name == "fc.weight" else std
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
            elif "norm" not in name:
                param.zero_()


def create_mtp_head(target_config: Any, block_size: int = 8, seed: int = 0, mask_token_id: int = 0) -> MtpHead:
    head = MtpHead(MtpConfig.for_target(target_config, block_size, mask_token_id))
    init_weights(head, seed)
    return head.float().train()


def last_attention_layer(model) -> int:
    """Index of the target's last full-attention decoder layer (every layer of an attention-only target)."""
    text = target_text_config(model.config)
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    if not full:
        raise DFlash2Error("the target has no full-attention layer to start an MTP head from")
    return full[-1]


def warm_start_from_target(head: MtpHead, target_model) -> list[str]:
    """Copy the target's last full-attention layer into the head's layer, and the target's final norm
    into the head's, wherever a tensor of the same name and shape exists; returns the names copied."""
    decoder = target_model.get_decoder() if hasattr(target_model, "get_decoder") else target_model.model
    source = decoder.layers[last_attention_layer(target_model)]
    theirs = dict(source.named_parameters())
    copied = []
    with torch.no_grad():
        for name, param in head.layers[0].named_parameters():
            if name in theirs and theirs[name].shape == param.shape:
                param.copy_(theirs[name].to(param.dtype))
                copied.append(f"layers.0.{name}")
        final = getattr(target_final_norm(target_model), "weight", None)   # the family's norm convention
        if final is not None and final.shape == head.norm.weight.shape:
            head.norm.weight.copy_(final.to(head.norm.weight.dtype))
            copied.append("norm.weight")
    return copied
