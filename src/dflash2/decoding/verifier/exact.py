"""`--exact-verify`: when it can hold, and the refusal when it cannot.

Contract: a verify pass reproduces a one-token step's arithmetic exactly when (1) each query's
attention runs over exactly the keys a one-token step sees, padded to a width that depends on
their count alone, in float32, one-token steps included (`targets.exact_attention`, the adapter's
part), (2) its matrix products give each row the bits it gets alone (batch-invariant
kernels for up to 32 rows, probed by `exact_attention.batch_invariant`; wider passes are
multiplied in chunks of 32 rows), and (3) the rest is per row (norms, RoPE, activations,
`full_logits.FullLogits`). Then greedy output equals plain decoding's token for token
at that precision, bfloat16 included.
- `check_plan(config, device, dtype)`: before the target loads, from its config: refuses (one-line
  `DFlash2Error`) recurrent (hybrid) targets, whose verify pass solves the recurrence for the
  whole block in another order, a device / dtype whose products of the target's shapes are
  not batch-invariant (float32 `F.linear` on x86 CPUs: MKL's one-row kernel; GPUs in general;
  dflash2's own Llama at float32 on a CPU is probed on oneDNN's packed kernel, which it
  multiplies by: `packed_products`), naming the
  product that failed and what holds instead, and a device whose attention kernel gives a query
  of a verify pass other bits than its one-token step (`exact_attention.attention_invariant`).
- `check_exact_verify(model, hybrid)`: after it loads: no recurrent layers, and the attention must
  be one whose passes `exact_attention` computes (dflash2's Llama, or a transformers model that
  `targets.kernels.use_kernels` switched to the folded kernel).
"""
from __future__ import annotations

import torch

from dflash2.errors import require
from dflash2.model import projections
from dflash2.targets import exact_attention, grouped_attention, llama

PROBE_OUT_LIMIT = 16384     # the head's probe uses at most this many vocabulary rows (memory)


def linear_shapes(text_config) -> list[tuple[int, int]]:
    """The (out, in) shapes of a decoder layer's projections and of the LM head (probe-sized)."""
    hidden = text_config.hidden_size
    head_dim = getattr(text_config, "head_dim", None) or hidden // text_config.num_attention_heads
    kv = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    inner = getattr(text_config, "intermediate_size", None) or 4 * hidden
    return [(text_config.num_attention_heads * head_dim, hidden), (kv * head_dim, hidden),
            (hidden, text_config.num_attention_heads * head_dim), (inner, hidden), (hidden, inner),
            (min(text_config.vocab_size, PROBE_OUT_LIMIT), hidden)]


def packed_products(text_config, device: str, dtype: torch.dtype) -> bool:
    """Whether the target's products will run oneDNN's packed float32 kernel: dflash2's own Llama
    (its config class) on a CPU at float32. (At bfloat16 its packed kernel gives `F.linear`'s bits
    up to `projections.SAME_BITS_ROWS` rows, so `F.linear` is probed.)"""
    return (isinstance(text_config, llama.LlamaTargetConfig) and str(device).startswith("cpu")
            and dtype == torch.float32 and projections.can_pack(torch.zeros(1, 1)))


def check_plan(text_config, device: str, dtype: torch.dtype) -> None:
    kinds = set(getattr(text_config, "layer_types", None) or [])
    recurrent = sorted(kinds - {"full_attention", "sliding_attention", "attention"})
    require(not recurrent, f"--exact-verify needs an attention-only target; this one has {', '.join(recurrent)} "
                           "layers, whose verify pass solves the recurrence for the whole block at once")
    packed = packed_products(text_config, device, dtype)
    holds, failed = exact_attention.batch_invariant(linear_shapes(text_config), dtype, device, packed=packed)
    name = str(dtype).removeprefix("torch.")
    require(holds, f"--exact-verify needs batch-invariant matrix products, and on this device ({device}, {name}) "
                   f"{failed} rounds differently from the same rows alone; it holds in bfloat16 on CPUs with "
                   "avx512_bf16 or AMX (oneDNN), and in float32 for dflash2's own Llama where oneDNN's packed "
                   "float32 kernel is row-invariant (an AVX2-only AMD EPYC)")
    heads = text_config.num_attention_heads
    kv = getattr(text_config, "num_key_value_heads", None) or heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    holds, failed = exact_attention.attention_invariant(kv, heads // kv, head_dim, dtype, device)
    require(holds, f"--exact-verify needs an attention kernel that computes a query alike alone and among others, "
                   f"and on this device ({device}) {failed}")


def check_exact_verify(model, hybrid: bool) -> None:
    require(not hybrid, "--exact-verify needs an attention-only target; this one has recurrent layers, whose "
                        "verify pass solves the recurrence for the whole block at once")
    own = type(model).__module__ == "dflash2.targets.llama"
    folded = getattr(model.config, "_attn_implementation", None) == grouped_attention.NAME
    require(own or folded, f"--exact-verify needs dflash2's Llama or a transformers model on sdpa attention; this "
                           f"{type(model).__name__} runs '{getattr(model.config, '_attn_implementation', '?')}'")
