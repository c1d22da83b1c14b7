"""Wall-clock accounting of decoding phases.

Contract: `Stopwatch(device)` is a context-manager factory: `with watch("verify"): ...` adds the
elapsed seconds to `watch.totals["verify"]`. On CUDA it synchronises before reading the clock, so
the figures are real kernel time, not launch time. `Stopwatch(None)` measures CPU wall time.
`CycleTimer(watch)` is one cycle's clock: its named parts, and wall / CPU time since it started.
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


class CycleTimer:
    """The clock of one decoding cycle: `with timer("verify", phase="verify"): ...` adds the
    elapsed seconds to `timer.seconds["verify"]` (and, with `phase`, to the stopwatch's phase);
    `wall()` / `cpu()` are the wall and process CPU seconds since the cycle started."""

    def __init__(self, watch: Stopwatch):
        self.watch = watch
        self.seconds: dict[str, float] = defaultdict(float)
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    @contextlib.contextmanager
    def __call__(self, part: str, phase: str | None = None):
        with self.watch(phase) if phase is not None else contextlib.nullcontext():
            start = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[part] += time.perf_counter() - start

    def wall(self) -> float:
        return time.perf_counter() - self._wall

    def cpu(self) -> float:
        return time.process_time() - self._cpu
