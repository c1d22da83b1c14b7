"""Target signals for training: online capture through forward hooks, with an optional disk cache.

Contract:
- `FeatureSource(adapter, cache_dir=None, cache_tag="", top_k=0)` is called with a `Batch` and
  returns `TargetSignals` for its (right-padded) sequences, computed by the frozen target under
  no_grad: `features` [b, L, n_taps * H_t] (`TargetAdapter.features`: decoder-layer outputs before
  the final norm) and, with `top_k` > 0, the target's own next-token prediction at every position
  as its `top_k` highest logits and their token ids, `top_logits` / `top_ids` [b, L, top_k] (for
  distillation). Padding positions hold arbitrary values; the block mask never lets a block see
  them and no label reads them.
- With `cache_dir`, each sequence's signals are stored once as
  `<cache_dir>/<tag>/<key[:2]>/<key>.safetensors` (atomic writes), `key` a hash of the sequence's
  token ids, and read back on later epochs / runs instead of running the target: an entry always
  belongs to the same tokens, however the data directories grow. `tag` must identify everything
  the features depend on (target, tapped layers, dtype, max_seq_len); `cache_tag(...)` builds one.
  An entry written with the target's top-k logits also serves runs that do not need them; an
  entry without them (or whose shapes do not match) is recomputed for a run that does.
- `fill(sequences)` computes and stores the signals of every sequence not cached yet (a progress
  bar; `dflash2 train CONFIG --features-only`), so that later runs spend no CPU on the target.
- Each sequence is run through the target on its own, at its own length: padded batches of
  chat data waste most of a padded pass (lengths from tens to a thousand tokens), and a small
  target is compute-bound on a CPU, so one unpadded pass per row is the cheaper way.
- The target sees exactly `batch.input_ids` / `batch.attention_mask` (positions 0..L_i-1, right
  padding), so cached and online signals describe the same tokens.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from tqdm import tqdm

from dflash2.errors import require
from dflash2.files.atomic import atomic_write
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.training.batches import Batch


def cache_tag(target_name: str, target_layer_ids: list[int], dtype: torch.dtype, max_seq_len: int) -> str:
    """Short stable id of what cached features depend on."""
    fields = {"target": str(target_name), "layers": list(target_layer_ids), "dtype": str(dtype),
              "max_seq_len": max_seq_len, "keys": "token-hash"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TargetSignals:
    features: torch.Tensor                  # [b, L, F]
    top_ids: torch.Tensor | None = None     # [b, L, k] long
    top_logits: torch.Tensor | None = None  # [b, L, k] fp32


class FeatureSource:
    def __init__(self, adapter: TargetAdapter, cache_dir: str | Path | None = None, tag: str = "features",
                 top_k: int = 0):
        self.adapter = adapter
        self.root = Path(cache_dir) / tag if cache_dir else None
        self.top_k = top_k
        self.hits = 0
        self.misses = 0

    @property
    def width(self) -> int:
        return len(self.adapter.target_layer_ids) * self.adapter.config.hidden_size

    def _path(self, ids: torch.Tensor) -> Path:
        key = hashlib.sha256(ids.to(torch.int32).cpu().numpy().tobytes()).hexdigest()[:24]
        return self.root / key[:2] / f"{key}.safetensors"

    def _compute_row(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Signals of one sequence ids [n_tok], run unpadded."""
        ids = ids[None].to(self.adapter.device)                                 # [1, n_tok]
        logits, features = self.adapter.features(ids, torch.ones_like(ids), with_logits=self.top_k > 0)
        row = {"features": features[0]}
        if self.top_k:
            top = logits[0].topk(self.top_k, dim=-1)                              # [n_tok, k]
            row.update(top_logits=top.values.float(), top_ids=top.indices.to(torch.int32))
        return row

    def __call__(self, batch: Batch) -> TargetSignals:
        lengths = [int(n) for n in batch.attention_mask.sum(dim=-1).tolist()]
        b, length = batch.input_ids.shape
        rows = []
        for r, n_tok in enumerate(lengths):
            ids = batch.input_ids[r, :n_tok]
            row = self._load(ids) if self.root is not None else None
            if row is None:
                self.misses += 1
                row = self._compute_row(ids)
                if self.root is not None:
                    self._store(ids, row)
            else:
                self.hits += 1
            rows.append(row)
        device = self.adapter.device

        def stack(name: str, dtype) -> torch.Tensor:                           # [b, L, ...], zero padding
            first = rows[0][name]
            out = torch.zeros(b, length, *first.shape[1:], dtype=dtype, device=device)
            for r, row in enumerate(rows):
                out[r, :row[name].shape[0]] = row[name].to(device, dtype)
            return out

        features = stack("features", rows[0]["features"].dtype)
        if not self.top_k:
            return TargetSignals(features)
        return TargetSignals(features, stack("top_ids", torch.long), stack("top_logits", torch.float32))

    def _load(self, ids: torch.Tensor) -> dict[str, torch.Tensor] | None:
        path = self._path(ids)
        if not path.is_file():
            return None
        try:
            row = load_file(str(path))
        except Exception:  # a damaged entry is simply recomputed
            return None
        n_tok = ids.shape[0]
        if tuple(row.get("features", torch.empty(0)).shape) != (n_tok, self.width):
            return None
        if self.top_k and any(tuple(row.get(k, torch.empty(0)).shape[:1]) != (n_tok,) or
                              row[k].shape[-1] < self.top_k for k in ("top_ids", "top_logits")):
            return None
        row["features"] = row["features"].to(self.adapter.dtype)
        if self.top_k:  # an entry may hold more of the target's top logits than this run uses
            row["top_ids"], row["top_logits"] = row["top_ids"][:, :self.top_k], row["top_logits"][:, :self.top_k]
        return row

    def fill(self, sequences, progress: bool = True) -> int:
        """Compute and cache the signals of every (input_ids, loss_mask) pair not cached yet; returns
        how many were computed."""
        require(self.root is not None, "config key 'data.feature_cache_dir' must be set to fill a feature cache")
        computed = 0
        for ids, _ in tqdm(sequences, desc="target features", unit="seq", disable=not progress):
            ids = torch.as_tensor(ids).long()
            if self._load(ids) is None:
                self._store(ids, self._compute_row(ids))
                computed += 1
        return computed

    def _store(self, ids: torch.Tensor, row: dict[str, torch.Tensor]) -> None:
        path = self._path(ids)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as handle:
            handle.write(save({k: v.detach().to("cpu").contiguous() for k, v in row.items()}))
