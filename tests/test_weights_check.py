"""`require_finite`'s one-sum fast path refuses exactly the tensors the element-wise check refuses."""
from __future__ import annotations

import pytest
import torch

from dflash2.errors import DFlash2Error
from dflash2.files.weights import require_finite


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_bad_value_is_refused_in_every_dtype(dtype, bad):
    tensor = torch.randn(4096).to(dtype)
    require_finite("w", tensor, "draft 'd'")
    tensor[1234] = bad
    with pytest.raises(DFlash2Error, match="tensor 'w' holds (NaN|infinite)"):
        require_finite("w", tensor, "draft 'd'")


def test_finite_values_whose_sum_overflows_are_accepted():
    require_finite("w", torch.full((8,), torch.finfo(torch.float64).max / 2, dtype=torch.float64), "draft 'd'")
    require_finite("w", torch.full((1 << 16,), torch.finfo(torch.float32).max, dtype=torch.float32), "draft 'd'")
    require_finite("ids", torch.arange(10), "draft 'd'")              # not floating: nothing to check
