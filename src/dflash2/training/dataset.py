"""Training sequences: loading shard directories and the deterministic order of a run.

Contract:
- The trainer's data interface is a list of `(input_ids, loss_mask)` pairs (1-D int / bool
  tensors or arrays; loss_mask True on the tokens to predict). `load_sequences(dirs, max_seq_len)`
  builds it from `dflash2.data.shards` directories (records = prompt + response, loss on the response),
  truncating each to `max_seq_len` and dropping sequences with fewer than 2 supervised tokens;
  with `exclude_holdout` the records of the held-out split (`dflash2.data.holdout`) are left out.
  Tokens are kept as int32, masks as bool (about 5 bytes per token in memory).
- `SequenceOrder(num_sequences, global_batch, seed)` fixes which sequences every optimiser step
  uses: epoch e is a permutation drawn from a generator seeded by (seed, e); step s takes the
  `global_batch` sequences at offset (s mod steps_per_epoch) * global_batch of epoch
  s // steps_per_epoch (the last partial batch of an epoch is dropped). It depends on nothing but
  (seed, step), which is what makes `--resume` and any number of ranks follow the same trajectory.
- `shard(step, rank, world, micro_batches)` splits the step's global batch into this rank's
  contiguous part and then into `micro_batches` equal micro-batches of `Example`s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from dflash2.data.holdout import is_held_out
from dflash2.data.shards import read_records
from dflash2.errors import require
from dflash2.training.batches import Example

Pair = tuple[torch.Tensor, torch.Tensor]


def to_pair(input_ids, loss_mask, max_seq_len: int | None = None) -> Pair:
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.int32).reshape(-1)
    mask = torch.as_tensor(np.asarray(loss_mask), dtype=torch.bool).reshape(-1)
    require(ids.shape == mask.shape, f"sequence has {ids.numel()} tokens but a loss mask of {mask.numel()}")
    if max_seq_len is not None:
        ids, mask = ids[:max_seq_len], mask[:max_seq_len]
    return ids, mask


def load_sequences(dirs: Iterable[str | Path], max_seq_len: int,
                   exclude_holdout: bool = False) -> tuple[list[Pair], dict]:
    """All records of the shard directories as (input_ids, loss_mask) pairs, plus counts."""
    pairs: list[Pair] = []
    counts = {"records": 0, "dropped": 0, "tokens": 0, "supervised_tokens": 0, "truncated": 0, "held_out": 0}
    for directory in dirs:
        require(Path(directory).is_dir(), f"config key 'data.train' / 'data.eval': '{directory}' is not a directory")
        for record in read_records(directory):
            if exclude_holdout and is_held_out(record.id):
                counts["held_out"] += 1
                continue
            counts["records"] += 1
            tokens = record.tokens
            if tokens.size > max_seq_len:
                counts["truncated"] += 1
            ids, mask = to_pair(tokens, record.loss_mask(), max_seq_len)
            if int(mask.sum()) < 2:
                counts["dropped"] += 1
                continue
            pairs.append((ids, mask))
            counts["tokens"] += ids.numel()
            counts["supervised_tokens"] += int(mask.sum())
    return pairs, counts


class SequenceOrder:
    def __init__(self, sequences: Sequence[Pair], global_batch: int, seed: int):
        require(len(sequences) >= global_batch,
                f"config key 'train.batch_size'={global_batch} exceeds the {len(sequences)} training sequences")
        self.sequences = sequences
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = len(sequences) // global_batch
        self._epoch, self._perm = -1, None

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(len(self.sequences), generator=generator)
        return self._perm

    def step_indices(self, step: int) -> tuple[int, list[int]]:
        """(epoch, sequence indices) of optimiser step `step` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.global_batch
        return epoch, self.permutation(epoch)[start:start + self.global_batch].tolist()

    def shard(self, step: int, rank: int, world: int, micro_batches: int) -> list[list[Example]]:
        epoch, indices = self.step_indices(step)
        per_rank = len(indices) // world
        mine = indices[rank * per_rank:(rank + 1) * per_rank]
        per_micro = len(mine) // micro_batches
        out = []
        for m in range(micro_batches):
            chunk = mine[m * per_micro:(m + 1) * per_micro]
            out.append([Example(self.sequences[i][0], self.sequences[i][1], key=(epoch, i), index=i) for i in chunk])
        return out
