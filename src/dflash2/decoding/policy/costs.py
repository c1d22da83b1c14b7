"""The cost model of a decoding cycle on this machine: the target's verify pass of q tokens for b
rows, the draft pass and the host work around them.

Contract:
- Verify figures come from two places, kept apart. Calibrated: `calibrate(target, block)` times
  one-row passes of 1, block, 4 x block and 16 x block tokens at start-up (in the adapter's
  `aside()`), or `load_calibration(table)` takes a stored one (`calibration`). Observed:
  `observe_verify(b, q, s)`, a moving average per (b, q) that replaces the calibrated figure at
  once. `observe_draft`, `observe_host` likewise; `draft_after(b, s)`: `draft(b)` once s is observed.
- `verify(b, q)`: the figure for (b, q); else linear in q between the figures at batch b around q;
  else the token curve (piecewise linear in n = b * q; flat below, the last slope above) scaled to
  the nearest figure at batch b. `optimistic=True` (a probe's): a figure not observed in this run is
  taken at most at what the observed ones alone predict. `draft(b)`, `host(b, spec)`: the nearest
  measured batch size's.
- `stale()`: a (b, q) observed `STALE_SAMPLES` times at a calibrated batch size differs from the
  calibration's prediction by more than `STALE_FACTOR` either way (once a plain step and a wider
  pass at one batch size were observed that often); `adopt_observed()` makes those the calibration.
"""
from __future__ import annotations

import time

import torch

EMA = 0.2
CALIBRATION_SIZES = (1, 4, 16)  # times the block: the q of the start-up passes (plus q = 1)
STALE_FACTOR = 1.5              # observed / calibrated beyond this (either way): the calibration is stale
STALE_SAMPLES = 4               # ... once a (b, q) was observed this often

VerifyTable = dict[tuple[int, int], float]   # (b, q) -> seconds


class CostModel:
    def __init__(self) -> None:
        self.calibrated_s: VerifyTable = {}
        self.observed_s: VerifyTable = {}
        self.observed_n: dict[tuple[int, int], int] = {}
        self.draft_s: dict[int, float] = {}
        self.host_s: dict[tuple[int, bool], float] = {}
        self.store = None       # where the calibration is stored (`calibration.StoredCalibration`), if anywhere

    @property
    def verify_s(self) -> VerifyTable:
        """Every verify figure: the observed one where there is one, else the calibrated one."""
        return {**self.calibrated_s, **self.observed_s}

    # ------------------------------------------------------------------ measurements
    @staticmethod
    def _averaged(table: dict, key, seconds: float) -> float:
        return seconds if key not in table else (1 - EMA) * table[key] + EMA * seconds

    def _update(self, table: dict, key, seconds: float) -> None:
        table[key] = self._averaged(table, key, seconds)

    def observe_verify(self, b: int, q: int, seconds: float) -> None:
        self._update(self.observed_s, (b, q), seconds)
        self.observed_n[(b, q)] = self.observed_n.get((b, q), 0) + 1

    def load_calibration(self, table: VerifyTable) -> None:
        self.calibrated_s.update(table)

    def stale(self) -> bool:
        seen = {(b, q) for (b, q), n in self.observed_n.items() if n >= STALE_SAMPLES}
        if not any(q > 1 and (b, 1) in seen for b, q in seen):
            return False          # the replacement needs both sides of the choice at one batch size:
                                  # a plain step and a wider pass (without the plain step, its cost
                                  # would be extrapolated from wide passes and speculation always "pay")
        calibrated_batches = {b for b, _ in self.calibrated_s}
        for (b, q), n in self.observed_n.items():
            if n >= STALE_SAMPLES and b in calibrated_batches:
                ratio = self.observed_s[(b, q)] / max(_predict(self.calibrated_s, b, q), 1e-12)
                if not 1 / STALE_FACTOR <= ratio <= STALE_FACTOR:
                    return True
        return False

    def adopt_observed(self) -> VerifyTable:
        """The figures observed `STALE_SAMPLES` times or more, as the new calibration: the rest of a
        calibration found wrong is not trusted either (predictions come from what was observed)."""
        self.calibrated_s = {key: self.observed_s[key] for key, n in self.observed_n.items() if n >= STALE_SAMPLES}
        return dict(self.calibrated_s)

    def observe_draft(self, b: int, seconds: float) -> None:
        self._update(self.draft_s, b, seconds)

    def draft_after(self, b: int, seconds: float) -> float:
        return self._averaged(self.draft_s, b, seconds)

    def observe_host(self, b: int, speculative: bool, seconds: float) -> None:
        self._update(self.host_s, (b, speculative), max(seconds, 0.0))

    @property
    def calibrated(self) -> bool:
        return len({b * q for b, q in self.verify_s}) >= 2

    def calibrate(self, target, block: int, context: int = 32, repeats: int = 2) -> None:
        """Time one-row passes of 1, block, 4 x block and 16 x block tokens (as the context allows) on a
        dummy context, the fastest of `repeats` each (a size's first pass is cold)."""
        room = target.max_positions - context
        sizes = [1] + [block * m for m in CALIBRATION_SIZES if block * m <= room]
        with target.aside():
            vocab = target.vocab_size
            target.prefill([[(7 * i + 3) % vocab for i in range(context)]])
            for q in sizes * repeats:
                ids = torch.full((1, q), 5 % vocab, dtype=torch.long, device=target.device)
                start = time.perf_counter()
                target.step(ids)
                if target.device.type == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - start
                self.calibrated_s[(1, q)] = min(seconds, self.calibrated_s.get((1, q), seconds))
                target.keep(torch.zeros(1, dtype=torch.long), q)

    # ------------------------------------------------------------------ predictions
    def verify(self, b: int, q: int, optimistic: bool = False) -> float:
        figure = _predict(self.verify_s, b, q)
        if optimistic and self.observed_s and (b, q) not in self.observed_s:
            return min(figure, _predict(self.observed_s, b, q))
        return figure

    def draft(self, b: int) -> float:
        return _nearest(self.draft_s, b)

    def host(self, b: int, speculative: bool) -> float:
        return _nearest({bb: s for (bb, spec), s in self.host_s.items() if spec == speculative}, b)


def _predict(table: VerifyTable, b: int, q: int) -> float:
    """`verify(b, q)` from one table (see the module docstring); 0 from an empty one."""
    if (b, q) in table:
        return table[(b, q)]
    same_b = sorted((qq, s) for (bb, qq), s in table.items() if bb == b)
    if len(same_b) >= 2 and same_b[0][0] <= q <= same_b[-1][0]:
        (q0, s0), (q1, s1) = _bracket(same_b, q)
        return max(s0 + (s1 - s0) * (q - q0) / (q1 - q0), 1e-6)
    if not table:
        return 0.0
    curve = _token_curve(table)
    if same_b:
        q0, s0 = min(same_b, key=lambda point: abs(point[0] - q))
        return max(s0 * _on_curve(curve, b * q) / max(_on_curve(curve, b * q0), 1e-9), 1e-6)
    return max(_on_curve(curve, b * q), 1e-6)


def _token_curve(table: VerifyTable) -> list[tuple[int, float]]:
    """[(n, seconds)] sorted by tokens per pass n = b * q (passes of equal n averaged)."""
    by_tokens: dict[int, list[float]] = {}
    for (b, q), s in table.items():
        by_tokens.setdefault(b * q, []).append(s)
    return sorted((n, sum(s) / len(s)) for n, s in by_tokens.items())


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
