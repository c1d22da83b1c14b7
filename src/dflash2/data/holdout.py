"""The held-out split of regenerated training data: records no recipe trains on, kept for measuring.

Contract: `is_held_out(record_id)` is True for about one record in `HOLDOUT_MODULUS` (64), chosen by
a hash of the record's id ("<dataset>:<id>"), so the split is the same in every shard directory,
on every machine, and for any number of records: growing a data directory never moves a record
between the split and the training set. Training leaves these out with `data.exclude_holdout`;
the yardstick (`dflash2.eval.yardstick`) decodes their prompts.
"""
from __future__ import annotations

import zlib

HOLDOUT_MODULUS = 64


def is_held_out(record_id: str) -> bool:
    return zlib.crc32(f"holdout:{record_id}".encode()) % HOLDOUT_MODULUS == 0
