"""A key/value cache layer that appends in place, for full-attention target layers.

Contract: `SlotLayer` is a Hugging Face cache layer (`transformers.cache_utils.DynamicLayer`
interface: `update`, `get_seq_length`, `get_mask_sizes`, `crop`, `batch_select_indices`) whose keys
and values live in buffers with spare capacity: `update` writes the new q slots in place and
returns views of the filled part, so a decoding step copies nothing but the new slots (a plain
`DynamicLayer` re-concatenates the whole cache on every step). The buffers grow by doubling.
`keys` / `values` read as views [b, heads, slots, d] and can be assigned (the buffer is rebuilt
with spare room), so code written for `DynamicLayer` works unchanged. `SlotLayer(storage=dtype)`
holds them in that dtype (`--exact-verify` keeps float32 keys and values: `exact_attention`
attends in float32). The spare room holds zeros, or keys and values cropped off, never garbage:
`exact_attention.mark_finite_room` records each buffer, and `exact_attention` reads past the filled
part of such a buffer as masked slots instead of copying a padded window.

With such layers a batch may keep "holes": slots of rejected draft tokens stay in the cache, masked
out by the adapter's attention mask, instead of every row being shifted after every cycle (see
`TargetAdapter.keep`). Slot order stays chronological, so causal attention in slot order is still
causal in time; positions are passed explicitly. Sliding-window layers measure their window in
slots and cannot have holes: targets with them keep the re-alignment path.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from dflash2.targets import exact_attention


def _buffer_view(name: str) -> property:
    """The `keys` / `values` attribute of a `SlotLayer`: reads the filled part of its buffer [b, heads,
    slots, d]; an assignment rebuilds the buffer with spare room (each buffer keeps its own fill, so
    assigning one never moves the other)."""
    def read(layer: "SlotLayer") -> torch.Tensor | None:
        buffer = layer._buffers[name]
        return None if buffer is None else buffer[:, :, :layer._filled[name]]

    def write(layer: "SlotLayer", tensor: torch.Tensor | None) -> None:
        if tensor is not None and layer.storage is not None:
            tensor = tensor.to(layer.storage)
        layer._buffers[name] = None if tensor is None else _with_room(tensor)
        layer._filled[name] = 0 if tensor is None else tensor.shape[-2]

    return property(read, write)


class SlotLayer(DynamicLayer):
    keys = _buffer_view("keys")
    values = _buffer_view("values")

    def __init__(self, storage: torch.dtype | None = None) -> None:
        self.storage = storage     # the dtype the buffers hold (None: the incoming keys')
        self._buffers: dict[str, torch.Tensor | None] = {"keys": None, "values": None}  # [b, heads, capacity, d]
        self._filled = {"keys": 0, "values": 0}
        super().__init__()

    # ------------------------------------------------------------------ storage
    @property
    def length(self) -> int:
        return self._filled["keys"]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        keys, values = self._buffers["keys"], self._buffers["values"]
        if keys is None:
            self.keys, self.values = key_states, value_states
            return self.keys, self.values
        if self.length + q > keys.shape[-2]:  # full: move into buffers twice the size
            keys, values = _with_room(self.keys, q), _with_room(self.values, q)
            self._buffers = {"keys": keys, "values": values}
        end = self.length + q
        keys[:, :, self.length:end] = key_states
        values[:, :, self.length:end] = value_states
        self._filled = {"keys": end, "values": end}
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            end = max(self.length + tokens_to_remove, 0)
            self._filled = {"keys": end, "values": end}

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._buffers["keys"] is not None:
            self._buffers = {name: buffer[indices] for name, buffer in self._buffers.items()}
            for buffer in self._buffers.values():
                exact_attention.mark_finite_room(buffer)   # copied whole: zeros or earlier keys past the filled part

    def reset(self) -> None:
        self._buffers = {"keys": None, "values": None}
        self._filled = {"keys": 0, "values": 0}
        self.is_initialized = False


def _with_room(tensor: torch.Tensor, extra: int = 0) -> torch.Tensor:
    """A buffer [b, heads, 2 * (slots + extra), d] whose first `slots` hold `tensor`, the rest zeros
    (`exact_attention.mark_finite_room`: attention may read past the filled part as masked slots)."""
    b, heads, slots, d = tensor.shape
    buffer = tensor.new_empty(b, heads, max(2 * (slots + extra), 16), d)
    buffer[:, :, :slots] = tensor
    buffer[:, :, slots:] = 0
    exact_attention.mark_finite_room(buffer)
    return buffer
