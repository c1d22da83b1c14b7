"""A key/value cache layer that appends in place, for full-attention target layers.

Contract: `SlotLayer` is a Hugging Face cache layer (`transformers.cache_utils.DynamicLayer`
interface: `update`, `get_seq_length`, `get_mask_sizes`, `crop`, `batch_select_indices`) whose keys
and values live in buffers with spare capacity: `update` writes the new q slots in place and
returns views of the filled part, so a decoding step copies nothing but the new slots (a plain
`DynamicLayer` re-concatenates the whole cache on every step). The buffers grow by doubling.
`keys` / `values` read as views [b, heads, slots, d] and can be assigned (the buffer is rebuilt
with spare room), so code written for `DynamicLayer` works unchanged.

With such layers a batch may keep "holes": slots of rejected draft tokens stay in the cache, masked
out by the adapter's attention mask, instead of every row being shifted after every cycle (see
`TargetAdapter.keep`). Slot order stays chronological, so causal attention in slot order is still
causal in time; positions are passed explicitly. Sliding-window layers measure their window in
slots and cannot have holes: targets with them keep the re-alignment path.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class SlotLayer(DynamicLayer):
    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None     # [b, heads, capacity, d]
        self._values: torch.Tensor | None = None
        self._filled = {"keys": 0, "values": 0}  # each buffer's own fill: assigning one never moves the other
        super().__init__()

    # ------------------------------------------------------------------ storage
    @property
    def length(self) -> int:
        return self._filled["keys"]

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, :self._filled["keys"]]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._keys = None if tensor is None else _with_room(tensor)
        self._filled["keys"] = 0 if tensor is None else tensor.shape[-2]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, :self._filled["values"]]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values = None if tensor is None else _with_room(tensor)
        self._filled["values"] = 0 if tensor is None else tensor.shape[-2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        if self._keys is None:
            self.keys, self.values = key_states, value_states
            return self.keys, self.values
        if self.length + q > self._keys.shape[-2]:  # full: move into buffers twice the size
            self._keys, self._values = _with_room(self.keys, q), _with_room(self.values, q)
        end = self.length + q
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self._filled = {"keys": end, "values": end}
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            end = max(self.length + tokens_to_remove, 0)
            self._filled = {"keys": end, "values": end}

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._keys is not None:
            self._keys, self._values = self._keys[indices], self._values[indices]

    def reset(self) -> None:
        self._keys = self._values = None
        self._filled = {"keys": 0, "values": 0}
        self.is_initialized = False


def _with_room(tensor: torch.Tensor, extra: int = 0) -> torch.Tensor:
    """A buffer [b, heads, 2 * (slots + extra), d] whose first `slots` hold `tensor`."""
    b, heads, slots, d = tensor.shape
    buffer = tensor.new_empty(b, heads, max(2 * (slots + extra), 16), d)
    buffer[:, :, :slots] = tensor
    return buffer
