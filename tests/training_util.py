"""Helpers shared by the training tests: synthetic sequences and small configs for tiny targets, and the
overrides of one tiny training step on real regenerated data (the commands that train arms)."""
from __future__ import annotations

import torch

from dflash2.training.config import TrainConfig


def synthetic_sequences(n: int = 16, vocab: int = 128, seed: int = 0, min_len: int = 20, max_len: int = 40):
    """(input_ids, loss_mask) pairs with a short unsupervised prompt and a supervised response.
    The response repeats a short pattern so a draft can learn something in a few steps."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len, (1,), generator=g))
        prompt = int(torch.randint(3, 8, (1,), generator=g))
        period = int(torch.randint(2, 5, (1,), generator=g))
        motif = torch.randint(3, vocab - 2, (period,), generator=g)
        ids = torch.cat([torch.randint(3, vocab - 2, (prompt,), generator=g), motif.repeat(length)])[:length]
        mask = torch.zeros(length, dtype=torch.bool)
        mask[prompt:] = True
        out.append((ids, mask))
    return out


def one_step_overrides(data) -> list[str]:
    """Config overrides: one training step of a one-layer draft on the shard directory `data`."""
    return [f"data.train=[{data}]", "data.max_seq_len=96", "data.feature_cache_dir=null", "draft.num_layers=1",
            "loss.num_anchors=2", "train.steps=1", "train.batch_size=2", "train.log_every=1",
            "train.checkpoint_every=null", "train.progress=false"]


def small_config(output_dir, **sections) -> TrainConfig:
    raw = {
        "draft": {"num_layers": 2, "selector_rank": 8, "selector_top_k": 8, "conv_group_size": 16},
        "loss": {"num_anchors": 4, "logits_chunk": 16},
        "data": {"max_seq_len": 64},
        "train": {"steps": 4, "batch_size": 4, "log_every": 1, "checkpoint_every": None,
                  "output_dir": str(output_dir), "progress": False, "seed": 0},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return TrainConfig.from_dict(raw)
