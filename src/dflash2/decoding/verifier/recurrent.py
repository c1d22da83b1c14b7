"""Recurrent layers of hybrid targets: each row's state rolled back to its accepted count, no second pass.

Contract:
- Hybrid targets interleave full attention with layers that carry a fixed-size state: Gated DeltaNet
  linear attention (`linear_attention`: a [heads, k_dim, v_dim] delta-rule state plus a short causal
  convolution over the projected q/k/v) in `qwen3_5` (also the text part of Qwen3_5ForConditionalGeneration),
  `qwen3_5_moe` and `qwen3_next`; short convolutions only (`conv`) in `lfm2` / `lfm2_moe`.
  `check_supported(model, config)` returns whether a target has such layers and refuses, in one line
  naming the layer type, any other recurrent kind (mamba, hybrid mamba/attention layers, ...).
- `RecurrentLayer` is the cache layer of one such layer (the interface of transformers'
  `LinearAttentionLayer`, so the HF mixers use it unchanged). `adopt(cache)` puts one in place of every
  linear-attention cache layer of a `DynamicCache` and returns them.
- Mechanism: capture during the verify pass. Inside `targets.delta_rule.capturing()` (the adapter's
  multi-token steps) every Gated DeltaNet layer leaves its step's `DeltaTrail` (the model must have
  been prepared by `targets.kernels.use_kernels`, as `targets` loads every target; an unprepared one
  is refused), and each conv layer keeps its whole input window [b, C, K + q] (K = kernel width).
  `keep(layers, counts)` then sets row r's state to the one after its counts[r]-th token: one rebuild
  (a reference when every row kept none), written into a buffer reused from the cycle before (the
  state it replaces), no second forward pass over the accepted tokens; a step that no `keep`
  followed counts as all kept.
- `begin_step(q)` notes the state a step starts from, so `keep` can also keep 0 tokens. Steps of one
  token (plain decoding) capture nothing and use HF's fast path (only the [b, C, K] conv window is copied).
- Left padding cannot reach the state: HF zeroes padded positions before the mixers, and with no
  projection biases (all supported families) a zero input leaves a zero state; `zero_padding(mask)`
  also clears the conv windows' padded slots after a prefill shorter than the kernel.
- `merge(old, new)` stacks two batches' states (rows of `new` last); `batch_select_indices` drops rows.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, LinearAttentionLayer

from dflash2.errors import require
from dflash2.targets.delta_rule import DeltaTrail, current_capture, fast_kernels, rule_installed

SUPPORTED_LAYER_TYPES = ("linear_attention", "conv")
RECURRENT_LAYER_TYPES = ("linear_attention", "conv", "mamba", "mamba2", "recurrent", "gated_deltanet", "hybrid",
                         "hybrid_sliding", "ssm", "rwkv", "linear")

# ---------------------------------------------------------------------------------------------- which targets
def check_supported(model, config) -> bool:
    """True when the target has recurrent layers (and they are supported); refuses the others."""
    layer_types = list(getattr(config, "layer_types", None) or [])
    kinds = sorted({t for t in layer_types if t in RECURRENT_LAYER_TYPES})
    unsupported = [t for t in kinds if t not in SUPPORTED_LAYER_TYPES]
    require(not unsupported, f"target '{config.model_type}' has recurrent layers ({', '.join(unsupported)}) whose "
                             "state dflash2 cannot roll back after a rejected draft, so it is not supported")
    if not kinds:
        return False
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for index, layer_type in enumerate(layer_types):
        if layer_type == "linear_attention":
            installed = rule_installed(decoder.layers[index])
            require(installed is not None, f"target '{config.model_type}' has recurrent layers (linear_attention) of a "
                                           "kind whose state dflash2 cannot roll back after a rejected draft, so it is "
                                           "not supported")
            require(installed, f"target '{config.model_type}' was not prepared for decoding: load it with "
                               "dflash2.targets (load_target_model), or call dflash2.targets.kernels.use_kernels(model)")
    return True


# ---------------------------------------------------------------------------------------------- the cache layer
class RecurrentLayer(LinearAttentionLayer):
    """A linear-attention / conv cache layer whose rows can be rolled back to any position of the last step."""

    def __init__(self, number_of_states: int = 1) -> None:
        super().__init__(number_of_states=number_of_states)
        self.windows: dict[int, torch.Tensor] = {}          # state -> conv input [b, C, K + q] of the last step
        self.trails: dict[int, DeltaTrail] = {}             # state -> what the last step's delta rule left
        self.before: dict[int, torch.Tensor] = {}           # state -> [b, H, K, V] before the last step
        self.conv_before: dict[int, torch.Tensor] = {}      # state -> [b, C, K] before a one-token step
        self.spare: dict[int, torch.Tensor] = {}            # state -> a free buffer for `keep` to rebuild into

    def activate_past_recording(self) -> None:  # roll-back is `keep`'s; HF's fast one-token path stays on
        pass

    def crop(self, tokens_to_remove: int) -> None:  # `keep` has already put each row's state in place
        pass

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None,
                          **kwargs) -> torch.Tensor:
        """conv_states [b, C, q] (the layer's conv input) -> what the causal conv runs over: the stored
        window of the last K inputs followed by the q new ones (a prefill: the new ones only)."""
        if not self.has_previous_state[state_idx]:
            self.conv_kernel_size[state_idx] = conv_kernel_size or conv_states.shape[-1]
            self.dtype, self.device = conv_states.dtype, conv_states.device
            self.is_conv_states_initialized[state_idx] = self.has_previous_state[state_idx] = True
            full = conv_states
        else:
            full = torch.cat([self.conv_states[state_idx], conv_states], dim=-1)
            if current_capture() is not None:
                self.windows[state_idx] = full
        width = self.conv_kernel_size[state_idx]
        self.conv_states[state_idx] = torch.nn.functional.pad(full, (max(width - full.shape[-1], 0), 0))[..., -width:]
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        capture = current_capture()
        if capture is not None and capture.trail is not None:
            self.trails[state_idx], capture.trail = capture.trail, None
        self.recurrent_states[state_idx] = recurrent_states
        self.is_recurrent_states_initialized[state_idx] = True
        return recurrent_states

    def begin_step(self, q: int) -> None:
        """Before a step of q tokens: remember the state it starts from (a one-token step updates the
        conv window in place, so that one is copied: [b, C, K]; the torch rules replace the recurrent
        state rather than write it, so a reference suffices, unless flash-linear-attention's kernel,
        which may write it in place, runs the one-token step)."""
        for i, trail in self.trails.items():                # a step left without `keep`: it kept every token
            with torch.inference_mode():
                self.recurrent_states[i] = trail.state_after(torch.full((trail.keys.shape[0],), trail.keys.shape[2]))
        self.windows, self.trails = {}, {}
        copy = q == 1 and fast_kernels()["fla"]
        self.before = {i: t.clone() if copy else t for i, t in self.recurrent_states.items() if t is not None}
        self.conv_before = {i: t.clone() for i, t in self.conv_states.items() if t is not None} if q == 1 else {}

    def keep(self, counts: torch.Tensor) -> None:
        """Each row r keeps the state after counts[r] (0..q) of the last step's tokens."""
        for i, window in self.windows.items():                              # [b, C, K + q]
            width = self.conv_kernel_size[i]
            index = (counts[:, None] + torch.arange(width, device=window.device))[:, None, :]   # [b, 1, K]
            self.conv_states[i] = window.gather(2, index.expand(-1, window.shape[1], -1)).contiguous()
        for i, before in self.conv_before.items():                         # a one-token step: 0 or 1 kept
            self.conv_states[i] = torch.where(counts[:, None, None] > 0, self.conv_states[i], before)
        rows = counts.tolist()
        same = all(n == rows[0] for n in rows)
        for i, before in self.before.items():
            trail = self.trails.get(i)
            if same and rows[0] == 0:                           # every row kept none
                self.recurrent_states[i] = before
            elif trail is not None:                             # rebuilt into the spare buffer; the start is freed
                spare = self.spare.get(i)
                fits = spare is not None and spare.shape == trail.start.shape and spare.dtype == trail.start.dtype
                with torch.inference_mode():                    # the buffers are the verify pass's tensors
                    self.recurrent_states[i] = trail.state_after(counts, spare if fits else None)
                self.spare[i] = trail.start
            elif not same:                                      # a one-token step, 0 or 1 kept per row
                self.recurrent_states[i] = torch.where(counts[:, None, None, None] > 0, self.recurrent_states[i],
                                                       before)
        self.windows, self.trails, self.before, self.conv_before = {}, {}, {}, {}

    def _states(self):
        for store in (self.conv_states, self.recurrent_states):
            for i, tensor in store.items():
                if tensor is not None:
                    yield store, i, tensor

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for store, i, tensor in list(self._states()):
            store[i] = tensor[indices.to(tensor.device)]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def zero_padding(self, mask: torch.Tensor) -> None:
        """mask [b, L] of a prefill (1 = real token): clear conv-window slots that hold padding."""
        for i, state in self.conv_states.items():
            if state is not None:
                width = state.shape[-1]
                real = torch.nn.functional.pad(mask, (max(width - mask.shape[1], 0), 0))[:, -width:]   # [b, K]
                self.conv_states[i] = state * real[:, None, :].to(state.dtype)


def adopt(cache: DynamicCache) -> list[RecurrentLayer]:
    """Replace the cache's linear-attention layers by `RecurrentLayer`s; returns them."""
    adopted = []
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionLayer):
            require(type(layer) is LinearAttentionLayer,
                    f"cache layer {type(layer).__name__} (recurrent and attention in one layer) cannot be rolled back")
            cache.layers[index] = RecurrentLayer(layer.number_of_states)
            adopted.append(cache.layers[index])
    return adopted


def merge(old: RecurrentLayer, new: RecurrentLayer) -> None:
    """Put `old`'s rows before `new`'s (in `new`)."""
    for store_new, store_old in ((new.conv_states, old.conv_states), (new.recurrent_states, old.recurrent_states)):
        for i, tensor in store_new.items():
            if tensor is not None and store_old.get(i) is not None:
                store_new[i] = torch.cat([store_old[i], tensor])
