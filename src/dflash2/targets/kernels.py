"""Every change dflash2 makes to a transformers model's code, in one place, applied at model load.

Contract: `use_kernels(model)` -> `model`, once for each target as it loads (`builtin.load_target_model`,
`tiny.tiny_target`; a model built otherwise is prepared by calling it):
- `sdpa` attention is switched to `grouped_attention`'s folded grouped-query kernel (the same
  arithmetic, the KV cache read where it lies instead of copied per query head in every pass;
  `grouped_attention.stock_attention` switches back for a block, e.g. the Hugging Face peers);
- each Gated DeltaNet layer's chunked delta rule is routed through `delta_rule`'s capturing rule
  (the model's own kernel outside `delta_rule.capturing()`, the verify pass's block rule with its
  trail inside), which the engine's `TargetAdapter` requires of a hybrid target.
Both are idempotent, and a model they do not apply to (another attention implementation, dflash2's
own Llama, no linear-attention layers) is left as it is.
"""
from __future__ import annotations

from dflash2.targets import delta_rule, grouped_attention


def use_kernels(model):
    grouped_attention.fold_transformers_attention(model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layer_types = list(getattr(config, "layer_types", None) or [])
    if "linear_attention" in layer_types:
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        for index, layer_type in enumerate(layer_types):
            if layer_type == "linear_attention":
                delta_rule.install_rule(decoder.layers[index])
    return model
