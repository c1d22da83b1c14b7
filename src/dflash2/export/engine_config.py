"""The `config.json` an engine reads: the checkpoint format made complete and engine-safe.

Contract: `engine_config(config, dtype)` returns the config dict of an exported draft. It starts
from the checkpoint format itself (`DFlash2Config.to_dict()`, the one place that maps fields to
keys) and adds what engines read through transformers' `Qwen3Config` and their own loaders but
the project leaves implicit: `hidden_act` (silu), `attention_bias` (false), `attention_dropout`,
`rope_parameters` (beside `rope_theta`, for readers of either), `dtype`, `max_window_layers`
(consistent with `layer_types`), and always `is_causal: false` (without it engines treat the
draft's sliding-window layers as causal), `layer_types`, `sliding_window` and
`use_sliding_window`. The architecture follows the parts the draft has. Keys that only this
project reads (`use_conv`, `use_selector`) never reach an engine: `engine_config` raises if they
would, since `neutral.py` must have completed or stripped the parts first.
"""
from __future__ import annotations

from dflash2.model.config import DFlash2Config

PROJECT_ONLY_KEYS = ("use_conv", "use_selector")


def _max_window_layers(layer_types: list[str]) -> int | None:
    """Qwen-style `max_window_layers` (layers from this index on use the window) when `layer_types`
    has that shape (full layers first, then sliding ones), else None (the key is left out)."""
    first = next((i for i, kind in enumerate(layer_types) if kind == "sliding_attention"), len(layer_types))
    tail_all_sliding = all(kind == "sliding_attention" for kind in layer_types[first:])
    head_all_full = all(kind == "full_attention" for kind in layer_types[:first])
    return first if tail_all_sliding and head_all_full else None


def engine_config(config: DFlash2Config, dtype: str) -> dict:
    if config.is_dflash2 and not (config.use_conv and config.use_selector):
        raise ValueError("engine_config needs a draft with both DFlash2 parts or neither (see neutral.py)")
    out = config.to_dict()
    leaked = [key for key in PROJECT_ONLY_KEYS if key in out["dflash_config"] or key in out]
    if leaked:
        raise ValueError(f"project-only key '{leaked[0]}' would reach an engine")
    out.update(
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        dtype=dtype,
        is_causal=False,
        layer_types=list(config.layer_types),
        sliding_window=config.sliding_window,
        use_sliding_window=bool(config.sliding_window) and "sliding_attention" in config.layer_types,
    )
    window_layers = _max_window_layers(list(config.layer_types))
    if window_layers is not None:
        out["max_window_layers"] = window_layers
    return out
