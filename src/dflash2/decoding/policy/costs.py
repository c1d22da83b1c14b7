"""The cost model of a decoding cycle on this machine (the target's verify pass of q tokens for b rows,
the draft pass, the host work around them) and its start-up calibration, stored per machine.

Contract:
- Verify figures come from two places, kept apart. Calibrated: `calibrate(target, block)` times
  one-row passes of 1, block, 4 x block and 16 x block tokens (in the adapter's `aside()`), or
  `load_calibration(table)` takes stored ones. Observed: `observe_verify(b, q, s)`, a moving average
  per (b, q) that replaces the calibrated figure at once. `observe_draft`, `observe_host` likewise;
  `draft_after(b, s)`: `draft(b)` once s is observed.
- `verify(b, q)`: the figure for (b, q); else linear in q between the figures at batch b around q;
  else the token curve (piecewise linear in n = b * q; flat below, the last slope above) scaled to
  the nearest figure at batch b. `optimistic=True` (a probe's): a figure not observed in this run is
  taken at most at what the observed ones alone predict. `draft(b)`, `host(b, spec)`: the nearest
  measured batch size's.
- `stale()`: a (b, q) observed `STALE_SAMPLES` times at a calibrated batch size differs from the
  calibration's prediction by more than `STALE_FACTOR` either way (once a plain step and a wider pass
  at one batch size were observed that often); `adopt_observed()` makes those the calibration.
- `calibrate_cached(costs, target, block)` -> `StoredCalibration`: the start-up figures from
  `cache_dir()/calibration/<key>.json` when stored less than `MAX_AGE_S` ago, else measured and
  stored (atomically). The key covers CPU, cores, threads, torch, device, the target's config and
  first weights, dtype and how a pass computes in it (the float32 LM head, `--exact-verify`), and
  block; `DFLASH2_RECALIBRATE=1` measures again. `StoredCalibration.refresh(costs)`: when
  `costs.stale()`, the observed figures replace the stored ones (the measurement's age kept). An
  unreadable or unwritable cache, or a stored table without the plain step or a wider pass, is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash2.files.atomic import atomic_write
from dflash2.files.cache import RECALIBRATE_ENV, cache_dir
from dflash2.runtime.provenance import cpu_model

EMA = 0.2
CALIBRATION_SIZES = (1, 4, 16)  # times the block: the q of the start-up passes (plus q = 1)
STALE_FACTOR = 1.5              # observed / calibrated beyond this (either way): the calibration is stale
STALE_SAMPLES = 4               # ... once a (b, q) was observed this often
MAX_AGE_S = 7 * 24 * 3600       # a stored calibration older than this is measured again
FORMAT = 2

VerifyTable = dict[tuple[int, int], float]   # (b, q) -> seconds


def _averaged(table: dict, key, seconds: float) -> float:
    return seconds if key not in table else (1 - EMA) * table[key] + EMA * seconds


class CostModel:
    def __init__(self) -> None:
        self.calibrated_s: VerifyTable = {}
        self.observed_s: VerifyTable = {}
        self.observed_n: dict[tuple[int, int], int] = {}
        self.draft_s: dict[int, float] = {}
        self.host_s: dict[tuple[int, bool], float] = {}
        self.store = None       # where the calibration is stored (`StoredCalibration`), if anywhere

    @property
    def verify_s(self) -> VerifyTable:
        """Every verify figure: the observed one where there is one, else the calibrated one."""
        return {**self.calibrated_s, **self.observed_s}

    @property
    def calibrated(self) -> bool:
        return len({b * q for b, q in self.verify_s}) >= 2

    def observe_verify(self, b: int, q: int, seconds: float) -> None:
        self.observed_s[(b, q)] = _averaged(self.observed_s, (b, q), seconds)
        self.observed_n[(b, q)] = self.observed_n.get((b, q), 0) + 1

    def observe_draft(self, b: int, seconds: float) -> None:
        self.draft_s[b] = self.draft_after(b, seconds)

    def draft_after(self, b: int, seconds: float) -> float:
        return _averaged(self.draft_s, b, seconds)

    def observe_host(self, b: int, speculative: bool, seconds: float) -> None:
        self.host_s[(b, speculative)] = _averaged(self.host_s, (b, speculative), max(seconds, 0.0))

    def load_calibration(self, table: VerifyTable) -> None:
        self.calibrated_s.update(table)

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

    def stale(self) -> bool:
        seen = {(b, q) for (b, q), n in self.observed_n.items() if n >= STALE_SAMPLES}
        if not any(q > 1 and (b, 1) in seen for b, q in seen):
            return False   # both sides of the choice at one batch size, or wide passes alone would price
                           # the plain step (by extrapolation) and speculation would always "pay"
        calibrated_batches = {b for b, _ in self.calibrated_s}
        for b, q in seen:
            if b in calibrated_batches:
                ratio = self.observed_s[(b, q)] / max(_predict(self.calibrated_s, b, q), 1e-12)
                if not 1 / STALE_FACTOR <= ratio <= STALE_FACTOR:
                    return True
        return False

    def adopt_observed(self) -> VerifyTable:
        """The figures observed `STALE_SAMPLES` times or more, as the new calibration (the rest of a
        calibration found wrong is not trusted either)."""
        self.calibrated_s = {key: self.observed_s[key] for key, n in self.observed_n.items() if n >= STALE_SAMPLES}
        return dict(self.calibrated_s)

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
    """The piecewise-linear curve [(n, seconds)] at n: flat below its first point, the last segment's
    slope (never negative) above its last."""
    if len(curve) == 1 or n <= curve[0][0]:
        return curve[0][1]
    if n >= curve[-1][0]:
        (n0, s0), (n1, s1) = curve[-2], curve[-1]
        return s1 + max((s1 - s0) / (n1 - n0), 0.0) * (n - n1)
    (n0, s0), (n1, s1) = next((left, right) for left, right in zip(curve, curve[1:]) if left[0] <= n <= right[0])
    return s0 + (s1 - s0) * (n - n0) / (n1 - n0)


def _nearest(table: dict[int, float], b: int) -> float:
    """The figure at batch b, else at the nearest measured batch size scaled by b / b', else 0."""
    if b in table:
        return table[b]
    if not table:
        return 0.0
    nearest = min(table, key=lambda bb: abs(bb - b))
    return table[nearest] * (b / nearest if nearest > b else 1.0)


def calibration_key(target, block: int) -> str:
    device, model = target.device, target.model
    first = next(model.parameters()).detach().reshape(-1)[:64].float().cpu()
    identity = {
        "cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "config": model.config.to_json_string(use_diff=False), "weights": first.numpy().tobytes().hex(),
        "dtype": str(target.dtype), "block": block,
        # how a pass computes at that precision: the float32 head (decoding.verifier.full_logits), query-by-query attention
        "numerics": {"full_logits": bool(getattr(getattr(target, "full_logits", None), "active", False)),
                     "exact_verify": bool(getattr(target, "exact_verify", False))},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


@dataclass
class StoredCalibration:
    path: Path
    measured_at: float          # when the full start-up measurement ran (time.time())

    def read(self) -> VerifyTable | None:
        """The stored figures, or None: none stored, unreadable, another format, too old, or without
        a plain step or anything else (such a table cannot weigh the choice)."""
        try:
            stored = json.loads(self.path.read_text(encoding="utf-8"))
            measured_at = float(stored["measured_at"])
            table = {(int(b), int(q)): float(s) for b, q, s in stored["verify"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if stored.get("format") != FORMAT or not 0 <= time.time() - measured_at <= MAX_AGE_S:
            return None
        if not any(q == 1 for _, q in table) or not any(q > 1 for _, q in table):
            return None
        self.measured_at = measured_at
        return table

    def write(self, table: VerifyTable) -> None:
        record = {"format": FORMAT, "measured_at": self.measured_at, "written_at": time.time(),
                  "verify": [[b, q, s] for (b, q), s in sorted(table.items())]}
        try:
            with atomic_write(self.path, "w") as handle:
                json.dump(record, handle)
        except OSError:
            pass  # a read-only or full cache: the figures still serve this run

    def refresh(self, costs: CostModel) -> bool:
        """Store what this run observed in place of a calibration it contradicts; True if it did."""
        if not costs.stale():
            return False
        self.write(costs.adopt_observed())
        return True


def calibrate_cached(costs: CostModel, target, block: int) -> StoredCalibration:
    store = StoredCalibration(cache_dir() / "calibration" / f"{calibration_key(target, block)}.json", time.time())
    if os.environ.get(RECALIBRATE_ENV) != "1":
        table = store.read()
        if table is not None:
            costs.load_calibration(table)
            if costs.calibrated:
                return store
    costs.calibrate(target, block)
    store.measured_at = time.time()
    store.write(costs.calibrated_s)
    return store
