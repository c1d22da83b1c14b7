"""The cost model of a cycle on this machine: the target's pass of q tokens for b rows, the draft pass
and the host work around them, in seconds.

Contract: verify figures are calibrated at start-up (`calibrate`: one-row passes of 1, block, 4 and
16 x block tokens, stored per machine and target by the policy, `files.calibration`) or observed
(`observe_verify`: a moving average per (b, q) that overrides the calibration; every observed time,
the draft's and the host's too, enters its average at most `SPIKE` x the average, and a figure's
first time, which pays a shape's one-time costs, gives way to its second where that is lower).
`verify(b, q)`: that figure, else linear in q between figures at batch b, else the token curve
(piecewise linear in n = b * q) scaled to the nearest figure at batch b. When the observed figures
contradict the calibration (`stale()`), `adopt_observed()` makes them the calibration.
"""
from __future__ import annotations

EMA = 0.2                       # the weight of a new figure in a moving average (`averaged`)
SPIKE, SPIKE_S = 1.5, 0.001     # an observed time counts at most this multiple of its running figure (or 1 ms
                                # more): one pass stalled by the host (3x at times) must not price the next cycles
CALIBRATION_SIZES = (1, 4, 16)  # times the block: the q of the start-up passes (plus q = 1) ...
CALIBRATION_CONTEXT, CALIBRATION_REPEATS = 32, 2   # ... on a dummy context of 32 tokens, each size twice
STALE_FACTOR = 1.5              # observed / calibrated beyond this (either way): the calibration is stale
STALE_SAMPLES = 4               # ... once a (b, q) was observed this often

VerifyTable = dict[tuple[int, int], float]   # (b, q) -> seconds


def averaged(old: float | None, new: float, weight: float = EMA) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def timed(old: float | None, seconds: float, seen: int = 2) -> float:
    """A time's running figure after one more observation (`seen`: those before it), a spike counted at
    `SPIKE` x the figure. The first pass of a shape in a process is a cold one (kernel and allocator
    set-up: 1.5-2x a warm pass on a CPU), so the second observation replaces it where lower."""
    if seen == 1:
        return min(old, seconds)
    return averaged(old, seconds if old is None else min(seconds, max(SPIKE * old, old + SPIKE_S)))


class CostModel:
    def __init__(self) -> None:
        self.calibrated_s: VerifyTable = {}
        self.observed_s: VerifyTable = {}
        self.observed_n: dict[tuple[int, int], int] = {}
        self.draft_s: dict[int, float] = {}
        self.host_s: dict[tuple[int, bool], float] = {}
        self.draft_n: dict[int, int] = {}                  # observations so far, as `observed_n`
        self.host_n: dict[tuple[int, bool], int] = {}
        self.store = None       # where the calibration is stored (`files.calibration.StoredCalibration`)

    @property
    def verify_s(self) -> VerifyTable:
        """Every verify figure: the observed one where there is one, else the calibrated one."""
        return {**self.calibrated_s, **self.observed_s}

    @property
    def calibrated(self) -> bool:
        return len({b * q for b, q in self.verify_s}) >= 2

    def observe_verify(self, b: int, q: int, seconds: float) -> None:
        self.observed_s[(b, q)] = timed(self.observed_s.get((b, q)), seconds, _counted(self.observed_n, (b, q)))

    def observe_draft(self, b: int, seconds: float) -> None:
        self.draft_s[b] = timed(self.draft_s.get(b), seconds, _counted(self.draft_n, b))

    def draft_after(self, b: int, seconds: float) -> float:
        """The draft figure were this pass observed (a cycle prices its own pass before `observe`)."""
        return timed(self.draft_s.get(b), seconds, self.draft_n.get(b, 0))

    def observe_host(self, b: int, speculative: bool, seconds: float) -> None:
        key = (b, speculative)
        self.host_s[key] = timed(self.host_s.get(key), max(seconds, 0.0), _counted(self.host_n, key))

    def load_calibration(self, table: VerifyTable) -> None:
        self.calibrated_s.update(table)

    def calibrate(self, target, block: int) -> None:
        """One-row passes of 1 and `CALIBRATION_SIZES` x block tokens (`TargetAdapter.time_passes`)."""
        room = target.max_positions - CALIBRATION_CONTEXT
        sizes = [1] + [block * m for m in CALIBRATION_SIZES if block * m <= room]
        for q, seconds in target.time_passes(sizes, CALIBRATION_CONTEXT, CALIBRATION_REPEATS).items():
            self.calibrated_s[(1, q)] = min(seconds, self.calibrated_s.get((1, q), seconds))

    def stale(self) -> bool:
        """A (b, q) observed `STALE_SAMPLES` times at a calibrated batch size is off the calibration by
        more than `STALE_FACTOR` either way."""
        seen = {(b, q) for (b, q), n in self.observed_n.items() if n >= STALE_SAMPLES}
        if not any(q > 1 and (b, 1) in seen for b, q in seen):
            return False   # both sides of the choice at one batch size, or wide passes alone would price
                           # the plain step (by extrapolation) and speculation would always "pay"
        batches = {b for b, _ in self.calibrated_s}
        ratios = [self.observed_s[(b, q)] / max(_predict(self.calibrated_s, b, q), 1e-12)
                  for b, q in seen if b in batches]
        return any(not 1 / STALE_FACTOR <= ratio <= STALE_FACTOR for ratio in ratios)

    def adopt_observed(self) -> VerifyTable:
        """The figures observed `STALE_SAMPLES` times or more replace the whole calibration."""
        self.calibrated_s = {key: self.observed_s[key] for key, n in self.observed_n.items() if n >= STALE_SAMPLES}
        return dict(self.calibrated_s)

    def verify(self, b: int, q: int, optimistic: bool = False) -> float:
        """`optimistic`: a figure not observed in this run, at most what the observed ones predict."""
        figure = _predict(self.verify_s, b, q)
        if optimistic and self.observed_s and (b, q) not in self.observed_s:
            return min(figure, _predict(self.observed_s, b, q))
        return figure

    def draft(self, b: int) -> float:
        """The figure at the nearest measured batch size (`host` likewise)."""
        return _nearest(self.draft_s, b)

    def host(self, b: int, speculative: bool) -> float:
        return _nearest({bb: s for (bb, spec), s in self.host_s.items() if spec == speculative}, b)


def _counted(counts: dict, key) -> int:
    """The observations of `key` before this one, counting this one."""
    seen = counts.get(key, 0)
    counts[key] = seen + 1
    return seen


def _predict(table: VerifyTable, b: int, q: int) -> float:
    """`verify(b, q)` from one table; 0 from an empty one."""
    if (b, q) in table:
        return table[(b, q)]
    same_b = sorted((qq, s) for (bb, qq), s in table.items() if bb == b)
    if len(same_b) >= 2 and same_b[0][0] <= q <= same_b[-1][0]:
        return max(_on_curve(same_b, q), 1e-6)
    if not table:
        return 0.0
    by_tokens: dict[int, list[float]] = {}      # the token curve: [(n = b * q, seconds)], equal n averaged
    for (bb, qq), s in table.items():
        by_tokens.setdefault(bb * qq, []).append(s)
    curve = sorted((n, sum(s) / len(s)) for n, s in by_tokens.items())
    if same_b:
        q0, s0 = min(same_b, key=lambda point: abs(point[0] - q))
        return max(s0 * _on_curve(curve, b * q) / max(_on_curve(curve, b * q0), 1e-9), 1e-6)
    return max(_on_curve(curve, b * q), 1e-6)


def _on_curve(curve: list[tuple[int, float]], n: int) -> float:
    """The piecewise-linear curve [(n, seconds)] at n: flat below it, the last slope (>= 0) above."""
    if len(curve) == 1 or n <= curve[0][0]:
        return curve[0][1]
    if n >= curve[-1][0]:
        (n0, s0), (n1, s1) = curve[-2], curve[-1]
        return s1 + max((s1 - s0) / (n1 - n0), 0.0) * (n - n1)
    (n0, s0), (n1, s1) = next((left, right) for left, right in zip(curve, curve[1:]) if left[0] <= n <= right[0])
    return s0 + (s1 - s0) * (n - n0) / (n1 - n0)


def _nearest(table: dict[int, float], b: int) -> float:
    """The figure at the nearest measured batch size b' (scaled by b / b' when b' > b), else 0."""
    if not table:
        return 0.0
    nearest = min(table, key=lambda bb: abs(bb - b))
    return table[nearest] * (b / nearest if nearest > b else 1.0)
