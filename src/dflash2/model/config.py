"""Draft configuration: the `config.json` contract of DFlash / DFlash2 checkpoints (docs/spec.md §2.1).

Contract:
- `DFlash2Config.from_dict(d)` accepts the published checkpoints' `config.json` (DFlash2 with
  `architectures: ["DFlash2DraftModel"]`, DFlash v1 with `["DFlashDraftModel"]`) and validates it;
  every bad or missing field raises `DFlash2Error` naming that field.
- `to_dict()` writes the same format back (round trip is exact for the fields we know; unknown
  keys are kept in `extra` and written back untouched).
- `DFlash2Config.for_target(target_config, shape, mask_token_id=...)` builds a fresh draft config
  of a `DraftShape` (default: the published shape, `model/shape.py`) for a Hugging Face target:
  same hidden size and vocabulary, target layers spread by the docs/spec.md §2.1 default rule, a
  conv group size that does not divide the hidden size replaced by their gcd.
- `validate_against_target(target_config)` checks that a draft can run on a target.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from dflash2.errors import DFlash2Error, require
from dflash2.model.shape import DEFAULT_SHAPE, DraftShape, target_text_config

DFLASH2_ARCH = "DFlash2DraftModel"
DFLASH_V1_ARCH = "DFlashDraftModel"

_REQUIRED_TOP = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "vocab_size")


# The JSON type of each known field: (kind, may be null). Checked before any value is used, so a
# wrong type is refused naming the field instead of failing somewhere inside.
_KINDS = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "ints": (lambda v: isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
             "a list of integers"),
    "strs": (lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v), "a list of strings"),
    "object": (lambda v: isinstance(v, dict), "an object"),
}
_TOP_TYPES = {
    "hidden_size": ("int", False), "intermediate_size": ("int", False), "num_hidden_layers": ("int", False),
    "num_attention_heads": ("int", False), "num_key_value_heads": ("int", False), "head_dim": ("int", True),
    "vocab_size": ("int", False), "num_target_layers": ("int", False), "rms_norm_eps": ("number", True),
    "rope_theta": ("number", True), "max_position_embeddings": ("int", True), "sliding_window": ("int", True),
    "layer_types": ("strs", True), "architectures": ("strs", True), "rope_parameters": ("object", True),
    "rope_scaling": ("object", True),
}
_DFLASH_TYPES = {
    "block_size": ("int", False), "mask_token_id": ("int", False), "target_layer_ids": ("ints", False),
    "target_hidden_size": ("int", True), "use_conv": ("bool", True), "use_selector": ("bool", True),
    "conv_kernel_size": ("int", True), "conv_group_size": ("int", True), "selector_rank": ("int", True),
    "selector_top_k": ("int", True), "input_embedding_scale": ("number", True), "output_multiplier": ("number", True),
    "final_logit_softcapping": ("number", True), "draft_vocab_size": ("int", True),
}


def _check_types(section: dict, types: dict, prefix: str) -> None:
    for name, (kind, nullable) in types.items():
        if name not in section or (nullable and section[name] is None):
            continue
        test, meaning = _KINDS[kind]
        require(test(section[name]), f"config field '{prefix}{name}' must be {meaning}, got {section[name]!r}")


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """docs/spec.md §2.1: without explicit ids, spread `num_taps` layers evenly from 1 to L-3."""
    require(num_target_layers >= 4, f"num_target_layers={num_target_layers}: the target needs at least 4 layers")
    if num_taps == 1:
        return [(1 + num_target_layers - 3) // 2]
    first, last = 1, num_target_layers - 3
    return [round(first + i * (last - first) / (num_taps - 1)) for i in range(num_taps)]


@dataclasses.dataclass
class DFlash2Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = DEFAULT_SHAPE.block_size
    target_hidden_size: int | None = None  # None: equals hidden_size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 32768
    sliding_window: int | None = DEFAULT_SHAPE.sliding_window
    layer_types: list[str] | None = None
    # DFlash2 parts; `use_conv` / `use_selector` False gives DFlash v1.
    use_conv: bool = DEFAULT_SHAPE.use_conv
    use_selector: bool = DEFAULT_SHAPE.use_selector
    conv_kernel_size: int = 2
    conv_group_size: int = DEFAULT_SHAPE.conv_group_size
    selector_rank: int = DEFAULT_SHAPE.selector_rank
    selector_top_k: int = DEFAULT_SHAPE.selector_top_k
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # A reduced draft vocabulary (frequency-ranked subset of the target's, mapped by the d2t / t2d
    # buffers in the checkpoint, EAGLE-3 style); None: the full vocabulary, the published format.
    draft_vocab_size: int | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.layer_types is None:
            self.layer_types = ["sliding_attention" if self.sliding_window else "full_attention"] * self.num_hidden_layers
        self.validate()

    # ------------------------------------------------------------------ properties
    @property
    def is_dflash2(self) -> bool:
        return self.use_conv or self.use_selector

    @property
    def architecture(self) -> str:
        return DFLASH2_ARCH if self.is_dflash2 else DFLASH_V1_ARCH

    @property
    def output_vocab_size(self) -> int:
        """Size of the draft's LM-head output: the draft vocabulary when reduced, else the target's."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0, f"config field '{name}' must be a positive integer, got {value!r}")
        require(self.num_attention_heads % self.num_key_value_heads == 0,
                f"config field 'num_key_value_heads'={self.num_key_value_heads} must divide num_attention_heads={self.num_attention_heads}")
        require(isinstance(self.block_size, int) and self.block_size >= 2,
                f"dflash_config field 'block_size' must be an integer >= 2, got {self.block_size!r}")
        require(isinstance(self.target_layer_ids, list) and len(self.target_layer_ids) > 0,
                "dflash_config field 'target_layer_ids' must be a non-empty list")
        for layer_id in self.target_layer_ids:
            require(isinstance(layer_id, int) and 0 <= layer_id < self.num_target_layers,
                    f"dflash_config field 'target_layer_ids' has {layer_id!r}, outside [0, {self.num_target_layers}) "
                    f"(num_target_layers={self.num_target_layers})")
        require(isinstance(self.mask_token_id, int) and 0 <= self.mask_token_id < self.vocab_size,
                f"dflash_config field 'mask_token_id'={self.mask_token_id!r} must be in [0, vocab_size={self.vocab_size})")
        require(len(self.layer_types) == self.num_hidden_layers,
                f"config field 'layer_types' has {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}")
        if self.use_conv:
            require(self.conv_kernel_size == 2, f"dflash_config field 'conv_kernel_size'={self.conv_kernel_size}: only 2 taps are defined")
            require(self.conv_group_size > 0 and self.hidden_size % self.conv_group_size == 0,
                    f"dflash_config field 'conv_group_size'={self.conv_group_size} must divide hidden_size={self.hidden_size}")
        if self.use_selector:
            require(self.selector_rank > 0, f"dflash_config field 'selector_rank' must be positive, got {self.selector_rank}")
            require(1 <= self.selector_top_k <= self.vocab_size,
                    f"dflash_config field 'selector_top_k'={self.selector_top_k} must be in [1, vocab_size]")
        if self.final_logit_softcapping is not None:
            require(self.final_logit_softcapping > 0, "dflash_config field 'final_logit_softcapping' must be positive")
        if self.draft_vocab_size is not None:
            require(isinstance(self.draft_vocab_size, int) and 1 <= self.draft_vocab_size <= self.vocab_size,
                    f"dflash_config field 'draft_vocab_size'={self.draft_vocab_size!r} must be in [1, vocab_size="
                    f"{self.vocab_size}]")
            require(not self.use_selector or self.selector_top_k <= self.draft_vocab_size,
                    f"dflash_config field 'selector_top_k'={self.selector_top_k} exceeds draft_vocab_size="
                    f"{self.draft_vocab_size}")

    def validate_against_target(self, target_config: Any) -> None:
        """Raise DFlash2Error unless this draft fits the Hugging Face `target_config`."""
        text = target_text_config(target_config)
        require(self.target_hidden_size == text.hidden_size,
                f"draft/target hidden size mismatch: draft expects target_hidden_size={self.target_hidden_size}, "
                f"target has hidden_size={text.hidden_size}")
        require(self.hidden_size == text.hidden_size,
                f"draft/target hidden size mismatch: draft hidden_size={self.hidden_size} must equal the target's "
                f"{text.hidden_size} (the draft uses the target's embeddings and lm_head)")
        require(self.vocab_size == text.vocab_size,
                f"draft/target vocab mismatch: draft vocab_size={self.vocab_size}, target vocab_size={text.vocab_size}")
        require(self.num_target_layers == text.num_hidden_layers,
                f"draft/target layer mismatch: draft num_target_layers={self.num_target_layers}, "
                f"target has {text.num_hidden_layers} layers")

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, data: dict) -> "DFlash2Config":
        data = dict(data)
        for name in _REQUIRED_TOP:
            require(name in data, f"config missing required field '{name}'")
        dflash = data.pop("dflash_config", None)
        require(isinstance(dflash, dict), "config missing required field 'dflash_config'")
        dflash = dict(dflash)
        for name in ("block_size", "mask_token_id", "target_layer_ids"):
            require(name in dflash, f"config missing required field 'dflash_config.{name}'")
        _check_types(data, _TOP_TYPES, "")
        _check_types(dflash, _DFLASH_TYPES, "dflash_config.")
        archs = data.pop("architectures", [DFLASH2_ARCH]) or [DFLASH2_ARCH]
        require(archs[0] in (DFLASH2_ARCH, DFLASH_V1_ARCH),
                f"config field 'architectures'={archs!r}: expected {DFLASH2_ARCH} or {DFLASH_V1_ARCH}")
        is_v2 = archs[0] == DFLASH2_ARCH
        rope = data.pop("rope_parameters", None) or data.pop("rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        require(rope_type == "default", f"config field 'rope_parameters.rope_type'={rope_type!r}: only 'default' RoPE is supported")
        d = _field_defaults()
        rope_theta = data.pop("rope_theta", rope.get("rope_theta", d["rope_theta"]))
        hidden = data.pop("hidden_size")
        heads = data.pop("num_attention_heads")
        kwargs = dict(
            hidden_size=hidden,
            intermediate_size=data.pop("intermediate_size"),
            num_hidden_layers=data.pop("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=data.pop("num_key_value_heads"),
            head_dim=data.pop("head_dim", None) or hidden // heads,
            vocab_size=data.pop("vocab_size"),
            rms_norm_eps=data.pop("rms_norm_eps", d["rms_norm_eps"]),
            rope_theta=float(rope_theta),
            max_position_embeddings=data.pop("max_position_embeddings", d["max_position_embeddings"]),
            sliding_window=data.pop("sliding_window", None),        # absent: no window (unlike a fresh draft)
            layer_types=data.pop("layer_types", None),
            block_size=dflash.pop("block_size"),
            mask_token_id=dflash.pop("mask_token_id"),
            target_layer_ids=list(dflash.pop("target_layer_ids")),
            target_hidden_size=dflash.pop("target_hidden_size", None),
            use_conv=is_v2 and dflash.pop("use_conv", True),              # a DFlash2 checkpoint has both parts
            use_selector=is_v2 and dflash.pop("use_selector", True),      # unless it says otherwise
            conv_kernel_size=dflash.pop("conv_kernel_size", d["conv_kernel_size"]),
            conv_group_size=dflash.pop("conv_group_size", d["conv_group_size"]),
            selector_rank=dflash.pop("selector_rank", d["selector_rank"]),
            selector_top_k=dflash.pop("selector_top_k", d["selector_top_k"]),
            input_embedding_scale=float(dflash.pop("input_embedding_scale", 1.0) or 1.0),
            output_multiplier=float(dflash.pop("output_multiplier", 1.0) or 1.0),
            final_logit_softcapping=dflash.pop("final_logit_softcapping", None),
            draft_vocab_size=dflash.pop("draft_vocab_size", None),
        )
        num_target_layers = data.pop("num_target_layers", None)
        require(num_target_layers is not None, "config missing required field 'num_target_layers'")
        kwargs["num_target_layers"] = num_target_layers
        for name in ("use_sliding_window", "model_type", "is_causal", "tie_word_embeddings", "torch_dtype", "dtype", "transformers_version"):
            data.pop(name, None)
        extra = {"top": data, "dflash": dflash}
        try:
            return cls(**kwargs, extra=extra)
        except TypeError as err:  # wrong value types surface here
            raise DFlash2Error(f"invalid config: {err}") from None

    def to_dict(self) -> dict:
        dflash = {
            "block_size": self.block_size,
            "mask_token_id": self.mask_token_id,
            "target_layer_ids": list(self.target_layer_ids),
        }
        if self.target_hidden_size != self.hidden_size:
            dflash["target_hidden_size"] = self.target_hidden_size
        if self.is_dflash2:
            dflash.update(conv_kernel_size=self.conv_kernel_size, conv_group_size=self.conv_group_size,
                          selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
            if not self.use_conv:
                dflash["use_conv"] = False
            if not self.use_selector:
                dflash["use_selector"] = False
        if self.input_embedding_scale != 1.0:
            dflash["input_embedding_scale"] = self.input_embedding_scale
        if self.output_multiplier != 1.0:
            dflash["output_multiplier"] = self.output_multiplier
        if self.final_logit_softcapping is not None:
            dflash["final_logit_softcapping"] = self.final_logit_softcapping
        if self.draft_vocab_size is not None:
            dflash["draft_vocab_size"] = self.draft_vocab_size
        dflash.update(self.extra.get("dflash", {}))
        out = {
            "architectures": [self.architecture],
            "model_type": "qwen3",
            "is_causal": False,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            # Qwen3Config (which engines use to read drafts) drops sliding_window without this flag.
            "use_sliding_window": self.sliding_window is not None,
            "num_target_layers": self.num_target_layers,
            "tie_word_embeddings": False,
            "dflash_config": dflash,
        }
        out.update(self.extra.get("top", {}))
        return out

    # ------------------------------------------------------------------ builders
    @classmethod
    def for_target(cls, target_config: Any, shape: DraftShape = DEFAULT_SHAPE, *,
                   mask_token_id: int) -> "DFlash2Config":
        """A draft of `shape` for a Hugging Face target config (unset shape fields: the target's)."""
        text = target_text_config(target_config)
        n_layers = text.num_hidden_layers
        target_layer_ids = shape.target_layer_ids
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(n_layers, shape.num_taps or min(shape.num_layers, n_layers - 3))
        attention = shape.attention(text)
        rope = getattr(text, "rope_parameters", None) or {}
        if isinstance(rope, dict) and "full_attention" in rope:  # per-layer-type rope (Gemma3)
            rope = rope["full_attention"]
        d = _field_defaults()
        rope_theta = rope.get("rope_theta", getattr(text, "rope_theta", d["rope_theta"])) if isinstance(rope, dict) \
            else d["rope_theta"]
        embed_scale = math.sqrt(text.hidden_size) if "gemma" in getattr(text, "model_type", "") else 1.0
        group = shape.conv_group_size
        if text.hidden_size % group:
            group = math.gcd(text.hidden_size, group)
        return cls(
            hidden_size=text.hidden_size,
            intermediate_size=shape.intermediate_size or text.intermediate_size,
            num_hidden_layers=shape.num_layers,
            num_attention_heads=attention.num_attention_heads,
            num_key_value_heads=attention.num_key_value_heads,
            head_dim=attention.head_dim,
            vocab_size=text.vocab_size,
            num_target_layers=n_layers,
            target_layer_ids=list(target_layer_ids),
            mask_token_id=mask_token_id,
            block_size=shape.block_size,
            rms_norm_eps=getattr(text, "rms_norm_eps", d["rms_norm_eps"]),
            rope_theta=float(rope_theta),
            max_position_embeddings=getattr(text, "max_position_embeddings", d["max_position_embeddings"]),
            sliding_window=shape.sliding_window,
            draft_vocab_size=shape.draft_vocab_size,
            use_conv=shape.use_conv,
            use_selector=shape.use_selector,
            selector_rank=shape.selector_rank,
            selector_top_k=shape.selector_top_k,
            conv_group_size=group,
            input_embedding_scale=embed_scale,
            final_logit_softcapping=getattr(text, "final_logit_softcapping", None),
        )


def _field_defaults() -> dict[str, Any]:
    """The dataclass defaults of `DFlash2Config` (the shape's from `DEFAULT_SHAPE`): what a
    `config.json` that leaves a field out means, and what a fresh draft takes when the target is silent."""
    return {f.name: f.default for f in dataclasses.fields(DFlash2Config) if f.default is not dataclasses.MISSING}
