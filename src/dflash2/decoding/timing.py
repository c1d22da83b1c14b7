"""Wall-clock accounting of decoding phases.

Contract: `Stopwatch(device)` is a context-manager factory: `with watch("verify"): ...` adds the
elapsed seconds to `watch.totals["verify"]`. On CUDA it synchronises before reading the clock, so
the figures are real kernel time, not launch time. `Stopwatch(None)` measures CPU wall time.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch


class Stopwatch:
    def __init__(self, device: torch.device | str | None):
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.totals: dict[str, float] = defaultdict(float)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    @contextlib.contextmanager
    def __call__(self, phase: str):
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.totals[phase] += time.perf_counter() - start

    def snapshot(self) -> dict[str, float]:
        return dict(self.totals)
