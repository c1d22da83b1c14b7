"""The cost model of a decoding cycle: how long the target takes to verify q tokens for b rows,
how long the draft pass takes, and the host work around them, on this machine.

Contract:
- `CostModel()` starts empty; `calibrate(target, block)` measures the target once at start-up
  (batch 1: q = 1 and q = block, on a dummy context, the running batch's cache left untouched).
- `observe_verify(b, q, s)`, `observe_draft(b, s)`, `observe_host(b, speculative, s)` add what
  each real cycle measured (an exponential moving average per (b, q), so the model follows the
  context growing and the machine's load).
- `verify(b, q)`: the measured figure for (b, q) when there is one; else linear in q between the
  figures measured at batch b; else the least-squares line t = a + c * (b * q) through all
  figures (the target's time grows with the tokens it runs). `draft(b)` and `host(b, spec)`
  likewise fall back on the nearest measured batch size (0 before any measurement).
"""
from __future__ import annotations

import time

import torch

EMA = 0.2


class CostModel:
    def __init__(self) -> None:
        self.verify_s: dict[tuple[int, int], float] = {}
        self.draft_s: dict[int, float] = {}
        self.host_s: dict[tuple[int, bool], float] = {}

    # ------------------------------------------------------------------ measurements
    @staticmethod
    def _update(table: dict, key, seconds: float) -> None:
        table[key] = seconds if key not in table else (1 - EMA) * table[key] + EMA * seconds

    def observe_verify(self, b: int, q: int, seconds: float) -> None:
        self._update(self.verify_s, (b, q), seconds)

    def observe_draft(self, b: int, seconds: float) -> None:
        self._update(self.draft_s, b, seconds)

    def observe_host(self, b: int, speculative: bool, seconds: float) -> None:
        self._update(self.host_s, (b, speculative), max(seconds, 0.0))

    @property
    def calibrated(self) -> bool:
        return len({b * q for b, q in self.verify_s}) >= 2

    def calibrate(self, target, block: int, context: int = 32, repeats: int = 2) -> None:
        """Time target passes of 1 row x 1 and x `block` tokens on a dummy context (the adapter's
        running batch is saved and restored)."""
        saved = (target.cache, target.mask, target.next_position)
        try:
            vocab = target.vocab_size
            target.prefill([[(7 * i + 3) % vocab for i in range(context)]])
            for q in (1, block, 1, block) * repeats:
                ids = torch.full((1, q), 5 % vocab, dtype=torch.long, device=target.device)
                start = time.perf_counter()
                target.step(ids)
                if target.device.type == "cuda":
                    torch.cuda.synchronize()
                self.observe_verify(1, q, time.perf_counter() - start)
                target.keep(torch.zeros(1, dtype=torch.long), q)
        finally:
            target.cache, target.mask, target.next_position = saved

    # ------------------------------------------------------------------ predictions
    def verify(self, b: int, q: int) -> float:
        if (b, q) in self.verify_s:
            return self.verify_s[(b, q)]
        same_b = sorted((qq, s) for (bb, qq), s in self.verify_s.items() if bb == b)
        if len(same_b) >= 2:
            (q0, s0), (q1, s1) = (same_b[0], same_b[-1]) if q > same_b[-1][0] or q < same_b[0][0] else \
                _bracket(same_b, q)
            return max(s0 + (s1 - s0) * (q - q0) / (q1 - q0), 1e-6)
        points = [(bb * qq, s) for (bb, qq), s in self.verify_s.items()]
        if len({n for n, _ in points}) < 2:
            return points[0][1] if points else 0.0
        mean_n = sum(n for n, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        slope = sum((n - mean_n) * (s - mean_s) for n, s in points) / sum((n - mean_n) ** 2 for n, _ in points)
        return max(mean_s + max(slope, 0.0) * (b * q - mean_n), 1e-6)

    def draft(self, b: int) -> float:
        return _nearest(self.draft_s, b)

    def host(self, b: int, speculative: bool) -> float:
        return _nearest({bb: s for (bb, spec), s in self.host_s.items() if spec == speculative}, b)


def _bracket(points: list[tuple[int, float]], q: int) -> tuple[tuple[int, float], tuple[int, float]]:
    """The two measured points around q (points sorted by q, q inside their range)."""
    for left, right in zip(points, points[1:]):
        if left[0] <= q <= right[0]:
            return left, right
    return points[0], points[-1]


def _nearest(table: dict[int, float], b: int) -> float:
    """The figure at batch b, else at the nearest measured batch size scaled by b / b', else 0."""
    if b in table:
        return table[b]
    if not table:
        return 0.0
    nearest = min(table, key=lambda bb: abs(bb - b))
    return table[nearest] * (b / nearest if nearest > b else 1.0)
