"""The Gated DeltaNet delta rule of hybrid targets, solved for a whole block at once with a trail
from which the state after any of its positions can be rebuilt (no second forward pass).

Contract:
- `install_rule(decoder_layer)`: routes the layer's modeling module's chunked delta rule
  (transformers' `torch_chunk_gated_delta_rule`) through `_CapturingRule`, once per module
  (`targets.kernels.use_kernels` does it at model load); `rule_installed(layer)` tells.
- Inside `capturing()` (the adapter's multi-token steps) the routed rule runs `delta_rule_block`
  (one chunk of q tokens, no padding) and leaves a `DeltaTrail` (`current_capture().trail`): the
  start state, the step's keys, its per-position corrections (deltas) and cumulative decays, from
  which `state_after(counts)` rebuilds each row's state after its first counts[r] tokens as one
  rank-n update of the start state. Capture, not replay: the deltas are what the verify pass
  computes anyway; and not the q states themselves (a token-by-token loop that keeps each
  position's state took 8 % longer than the model's chunked kernel in bf16). Outside
  `capturing()` (prefills, training, `generate()`) the model's own kernel runs.
- `fast_kernels()`: whether flash-linear-attention and causal-conv1d are importable.
The cache layer that keeps the trail is `decoding.verifier.recurrent.RecurrentLayer`.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import sys
from dataclasses import dataclass

import torch

_RULE = "torch_chunk_gated_delta_rule"        # the name HF's Gated DeltaNet mixers call for q > 1 tokens

_capture: contextvars.ContextVar["_Capture | None"] = contextvars.ContextVar("dflash2_capture", default=None)


class _Capture:
    """The trail the current layer's delta rule left, waiting for its `update_recurrent_state`."""

    def __init__(self) -> None:
        self.trail: DeltaTrail | None = None


@contextlib.contextmanager
def capturing():
    """Inside: Gated DeltaNet layers solve their step's block with `delta_rule_block` and leave its trail."""
    token = _capture.set(_Capture())
    try:
        yield
    finally:
        _capture.reset(token)


@functools.cache
def fast_kernels() -> dict[str, bool]:
    """Whether flash-linear-attention (`fla`) and `causal_conv1d` are importable (HF then uses them
    outside `capturing()`)."""
    return {name: importlib.util.find_spec(name) is not None for name in ("fla", "causal_conv1d")}


def _rule_module(decoder_layer):
    """The modeling module whose chunked delta rule the layer's mixer calls (None: no such mixer)."""
    mixer = getattr(decoder_layer, "linear_attn", None)
    module = sys.modules[type(mixer).__module__] if mixer is not None else None
    return module if module is not None and hasattr(module, _RULE) else None


def install_rule(decoder_layer) -> bool:
    """Route the mixer module's chunked delta rule through `_CapturingRule` (once per modeling module);
    False when the layer has no such mixer."""
    module = _rule_module(decoder_layer)
    if module is None:
        return False
    if not isinstance(getattr(module, _RULE), _CapturingRule):
        setattr(module, _RULE, _CapturingRule(getattr(module, _RULE)))
    return True


def rule_installed(decoder_layer) -> bool | None:
    """Whether the layer's delta rule is routed (None: the layer has no such mixer)."""
    module = _rule_module(decoder_layer)
    return None if module is None else isinstance(getattr(module, _RULE), _CapturingRule)


class _CapturingRule:
    """The model's own chunked delta rule, except inside `capturing()`, where `delta_rule_block` runs and
    leaves its `DeltaTrail` for the layer's cache."""

    def __init__(self, original) -> None:
        self.original = original

    def __call__(self, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, **kwargs):
        capture = _capture.get()
        if capture is None or initial_state is None:
            return self.original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                                 output_final_state=output_final_state,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        out, trail = delta_rule_block(query, key, value, g, beta, initial_state, use_qk_l2norm_in_kernel)
        capture.trail = trail
        return out, trail.start              # the layer's state stays the start one until `keep` rebuilds it


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


@dataclass
class DeltaTrail:
    """What a step of q tokens leaves so that the state after any n <= q of them can be rebuilt:
    S_n = exp(G_n) S_0 + sum_{t < n} exp(G_n - G_t) k_t^T delta_t (the delta rule unrolled), with G the
    cumulative log decay and delta_t the step's per-position corrections. fp32, heads grouped out."""

    start: torch.Tensor         # [b, H, K, V] the state before the step
    keys: torch.Tensor          # [b, H, q, K] (normalised)
    deltas: torch.Tensor        # [b, H, q, V]
    log_decay: torch.Tensor     # [b, H, q] G_t = g_0 + .. + g_t

    def state_after(self, counts: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """counts [b] (0..q) -> each row's state after its first counts[r] tokens [b, H, K, V]: a decayed
        copy of the start state plus one rank-q update per row, written into `out` when given (a buffer
        of the start's shape and dtype: a fresh one of that size costs more than the arithmetic, since
        its pages are new to the process)."""
        n = counts.to(self.log_decay.device).view(-1, 1, 1)                                  # [b, 1, 1]
        heads = self.log_decay.shape[1]
        last = self.log_decay.gather(2, (n - 1).clamp(min=0).expand(-1, heads, 1))          # [b, H, 1] G_{n-1}
        last = torch.where(n > 0, last, torch.zeros_like(last))
        position = torch.arange(self.log_decay.shape[2], device=n.device)                    # [q]
        weight = (last - self.log_decay).masked_fill(position >= n, float("-inf")).exp()     # [b, H, q], 0 past n
        keys = (self.keys * weight[..., None]).transpose(-1, -2)                              # [b, H, K, q]
        decayed = last.exp()[..., None]                                                       # [b, H, 1, 1]
        state = torch.mul(self.start, decayed, out=out) if out is not None else self.start * decayed
        k_dim, v_dim = state.shape[-2:]
        state.view(-1, k_dim, v_dim).baddbmm_(keys.reshape(-1, k_dim, keys.shape[-1]),
                                             self.deltas.reshape(-1, keys.shape[-1], v_dim))   # + k^T delta
        return state


def delta_rule_block(query, key, value, g, beta, state, l2norm: bool) -> tuple[torch.Tensor, DeltaTrail]:
    """The gated delta rule over one block of q tokens, solved at once (one chunk, no padding).
    query/key [b, q, Hk, K], value [b, q, H, V], g/beta [b, q, H], state [b, H, K, V] -> (output
    [b, q, H, V] in value's dtype, the step's `DeltaTrail`). Reads the start state once (every position's
    read of it in one product) and writes no state: `keep` builds the one each row keeps. A token-by-token
    loop would read and write the state about three times per token."""
    heads, dtype = value.shape[2], value.dtype
    if key.shape[2] != heads:  # grouped values: each q/k head serves heads // Hk value heads
        query, key = (x.repeat_interleave(heads // key.shape[2], dim=2) for x in (query, key))
    query, key, value, g, beta = (x.transpose(1, 2).float() for x in (query, key, value, g, beta))   # [b, H, q, ..]
    if l2norm:
        query, key = _unit(query), _unit(key)
    query = query / query.shape[-1] ** 0.5
    start = state.float()
    steps = value.shape[2]
    decay = g.cumsum(-1)                                                                     # [b, H, q] G
    later = torch.ones(steps, steps, dtype=torch.bool, device=g.device).triu(1)             # s > t
    pair = (decay[..., :, None] - decay[..., None, :]).masked_fill(later, float("-inf")).exp()   # [b, H, q, q]
    read = torch.cat([query, key], dim=2) @ start                                            # [b, H, 2q, V]
    query_read, key_read = read.split(steps, dim=2)
    scale = decay.exp()[..., None]                                                           # [b, H, q, 1]
    # delta_t = beta_t (v_t - k_t S_{t-1} decayed): lower-triangular in the earlier deltas
    system = (key @ key.transpose(-1, -2)) * pair * beta[..., None]                          # [b, H, q, q]
    deltas = torch.linalg.solve_triangular(system, beta[..., None] * (value - scale * key_read), upper=False,
                                           unitriangular=True)                               # [b, H, q, V]
    out = scale * query_read + ((query @ key.transpose(-1, -2)) * pair) @ deltas             # o_t = q_t S_t
    return out.transpose(1, 2).to(dtype), DeltaTrail(start, key, deltas, decay)




def current_capture() -> "_Capture | None":
    """The capture of the `capturing()` block this runs in (None outside one)."""
    return _capture.get()
