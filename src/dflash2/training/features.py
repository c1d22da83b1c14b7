"""Target features for training: online capture through forward hooks, with an optional disk cache.

Contract:
- `FeatureSource(adapter, cache_dir=None, cache_tag="")` is called with a `Batch` and returns the
  tapped target features [b, L, n_taps * H_t] for its (right-padded) sequences, computed by the
  frozen target under no_grad (`TargetAdapter.features`: decoder-layer outputs before the final
  norm). Padding positions hold arbitrary values; the block mask never lets a block see them.
- With `cache_dir`, each sequence's features [L_i, F] are stored once as
  `<cache_dir>/<tag>/<index // 1000>/<index>.safetensors` (atomic writes) and read back on later
  epochs / runs instead of running the target. `tag` must identify everything the features depend
  on (target, tapped layers, dtype, max_seq_len); `cache_tag(...)` builds one. A cached entry whose
  length or width does not match is recomputed.
- Each sequence is run through the target on its own, at its own length: padded batches of
  ShareGPT-like data waste most of a padded pass (lengths 40..1024), and a 135M-parameter target
  is compute-bound on a CPU, so one unpadded pass per row is the cheaper way (TRAINING.md has the
  measured step times).
- The target sees exactly `batch.input_ids` / `batch.attention_mask` (positions 0..L_i-1, right
  padding), so cached and online features describe the same tokens.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from dflash2.fileio import atomic_write
from dflash2.decoding.target import TargetAdapter
from dflash2.training.batches import Batch


def cache_tag(target_name: str, target_layer_ids: list[int], dtype: torch.dtype, max_seq_len: int) -> str:
    """Short stable id of what cached features depend on."""
    text = json.dumps({"target": str(target_name), "layers": list(target_layer_ids), "dtype": str(dtype),
                       "max_seq_len": max_seq_len}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class FeatureSource:
    def __init__(self, adapter: TargetAdapter, cache_dir: str | Path | None = None, tag: str = "features"):
        self.adapter = adapter
        self.root = Path(cache_dir) / tag if cache_dir else None
        self.hits = 0
        self.misses = 0

    @property
    def width(self) -> int:
        return len(self.adapter.target_layer_ids) * self.adapter.config.hidden_size

    def _path(self, index: int) -> Path:
        return self.root / f"{index // 1000:05d}" / f"{index}.safetensors"

    def _compute_row(self, input_ids: torch.Tensor, n_tok: int) -> torch.Tensor:
        """Features [n_tok, F] of one sequence, run unpadded."""
        ids = input_ids[None, :n_tok].to(self.adapter.device)                  # [1, n_tok]
        _, features = self.adapter.features(ids, torch.ones_like(ids))
        return features[0]

    def __call__(self, batch: Batch) -> torch.Tensor:
        lengths = [int(n) for n in batch.attention_mask.sum(dim=-1).tolist()]
        b, length = batch.input_ids.shape
        rows: list[torch.Tensor] = []
        for r, (index, n_tok) in enumerate(zip(batch.indices, lengths)):
            row = self._load(index, n_tok) if self.root is not None else None
            if row is None:
                self.misses += 1
                row = self._compute_row(batch.input_ids[r], n_tok)
                if self.root is not None:
                    self._store(index, row)
            else:
                self.hits += 1
            rows.append(row)
        device, dtype = self.adapter.device, rows[0].dtype
        out = torch.zeros(b, length, rows[0].shape[-1], dtype=dtype, device=device)  # [b, L, F], zero padding
        for r, row in enumerate(rows):
            out[r, :row.shape[0]] = row.to(device, dtype)
        return out

    def _load(self, index: int, n_tok: int) -> torch.Tensor | None:
        path = self._path(index)
        if not path.is_file():
            return None
        try:
            tensor = load_file(str(path))["features"]
        except Exception:  # a damaged entry is simply recomputed
            return None
        if tuple(tensor.shape) != (n_tok, self.width):
            return None
        return tensor.to(self.adapter.dtype)

    def _store(self, index: int, features: torch.Tensor) -> None:
        path = self._path(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as handle:
            handle.write(save({"features": features.detach().to("cpu").contiguous()}))

