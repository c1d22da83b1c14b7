"""The cost model of a decoding cycle: how long the target takes to verify q tokens for b rows,
how long the draft pass takes, and the host work around them, on this machine.

Contract:
- `CostModel()` starts empty; `calibrate(target, block)` measures the target once at start-up:
  one row running q = 1, block, 4 x block and 16 x block tokens on a dummy context (the running
  batch's cache left untouched), so that the token curve reaches the compute-bound sizes of
  large batches before any large batch has run.
- `observe_verify(b, q, s)`, `observe_draft(b, s)`, `observe_host(b, speculative, s)` add what
  each real cycle measured (an exponential moving average per (b, q), so the model follows the
  context growing and the machine's load).
- `verify(b, q)`: the measured figure for (b, q) when there is one; else linear in q between the
  two figures measured at batch b around q; else the token curve f(n) -- piecewise linear in the
  tokens n = b * q of every measured pass, extended past its ends (flat below, the last segment's
  slope above) -- scaled to the nearest figure measured at batch b when there is one (the level
  of this batch's context, the shape of the machine's curve). `draft(b)` and `host(b, spec)`
  fall back on the nearest measured batch size (0 before any measurement).
"""
from __future__ import annotations

import time

import torch

EMA = 0.2
CALIBRATION_SIZES = (1, 4, 16)  # times the block: the q of the start-up passes (plus q = 1)


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
        """Time one-row target passes of 1, block, 4 x block and 16 x block tokens (as far as the
        context limit allows) on a dummy context; the adapter's running batch is saved and restored."""
        saved = (target.cache, target.mask, target.next_position)
        room = target.max_positions - context
        sizes = [1] + [block * m for m in CALIBRATION_SIZES if block * m <= room]
        try:
            vocab = target.vocab_size
            target.prefill([[(7 * i + 3) % vocab for i in range(context)]])
            for q in sizes * repeats:
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
        if len(same_b) >= 2 and same_b[0][0] <= q <= same_b[-1][0]:
            (q0, s0), (q1, s1) = _bracket(same_b, q)
            return max(s0 + (s1 - s0) * (q - q0) / (q1 - q0), 1e-6)
        if not self.verify_s:
            return 0.0
        curve = self._token_curve()
        if same_b:
            q0, s0 = min(same_b, key=lambda point: abs(point[0] - q))
            return max(s0 * _on_curve(curve, b * q) / max(_on_curve(curve, b * q0), 1e-9), 1e-6)
        return max(_on_curve(curve, b * q), 1e-6)

    def _token_curve(self) -> list[tuple[int, float]]:
        """[(n, seconds)] sorted by tokens per pass n = b * q (passes of equal n averaged)."""
        by_tokens: dict[int, list[float]] = {}
        for (b, q), s in self.verify_s.items():
            by_tokens.setdefault(b * q, []).append(s)
        return sorted((n, sum(s) / len(s)) for n, s in by_tokens.items())

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


def _on_curve(curve: list[tuple[int, float]], n: int) -> float:
    """The piecewise-linear curve at n: flat below its first point, the last segment's slope
    (never negative) above its last."""
    if len(curve) == 1 or n <= curve[0][0]:
        return curve[0][1]
    if n >= curve[-1][0]:
        (n0, s0), (n1, s1) = curve[-2], curve[-1]
        return s1 + max((s1 - s0) / (n1 - n0), 0.0) * (n - n1)
    (n0, s0), (n1, s1) = _bracket(curve, n)
    return s0 + (s1 - s0) * (n - n0) / (n1 - n0)


def _nearest(table: dict[int, float], b: int) -> float:
    """The figure at batch b, else at the nearest measured batch size scaled by b / b', else 0."""
    if b in table:
        return table[b]
    if not table:
        return 0.0
    nearest = min(table, key=lambda bb: abs(bb - b))
    return table[nearest] * (b / nearest if nearest > b else 1.0)
