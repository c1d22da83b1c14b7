"""Frequency-ranked draft vocabularies: which target tokens a reduced-vocabulary draft can propose.

Contract: `frequency_vocabulary(sequences, size, always=())` counts how often each token id occurs
as a supervised (response) token in `sequences` ((input_ids, loss_mask) pairs), and returns the
`size` most frequent ids, ascending, with every id in `always` (e.g. the stop tokens, which end
every answer) included first. Ties go to the lower id, so the result depends on the data only.
`coverage(sequences, ids)` is the share of supervised tokens the vocabulary contains (the ceiling
it puts on per-token acceptance).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from dflash2.errors import require


def _counts(sequences: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        counts += torch.bincount(torch.as_tensor(ids)[torch.as_tensor(mask)].long(), minlength=vocab_size)[:vocab_size]
    return counts


def frequency_vocabulary(sequences: Sequence[tuple[torch.Tensor, torch.Tensor]], size: int, vocab_size: int,
                         always: Iterable[int] = ()) -> torch.Tensor:
    """-> [size] target token ids, ascending."""
    always = sorted({int(i) for i in always})
    require(0 < size <= vocab_size, f"draft vocabulary size {size} must be in [1, {vocab_size}]")
    require(len(always) <= size, f"draft vocabulary of {size} cannot hold the {len(always)} required tokens")
    counts = _counts(sequences, vocab_size)
    counts[always] = counts.max() + 1 if counts.numel() else 1                      # always kept
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))          # by count, then id
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def coverage(sequences: Sequence[tuple[torch.Tensor, torch.Tensor]], ids: torch.Tensor, vocab_size: int) -> float:
    counts = _counts(sequences, vocab_size)
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0
