"""The one table of dtype names a user may give, and the torch dtypes they mean.

Contract: `DTYPES` maps every accepted name (float32 / fp32, bfloat16 / bf16, float16 / fp16) to its
torch dtype; `parse_dtype(name)` looks one up, refusing an unknown name in one line.
"""
from __future__ import annotations

import torch

from dflash2.errors import require

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    require(name in DTYPES, f"unknown dtype '{name}' (choose from float32, bfloat16, float16)")
    return DTYPES[name]
