"""The cost model's start-up calibration, stored per machine, target and dtype, and kept fresh.

Contract: `calibrate_cached(costs, target, block)` -> `StoredCalibration` fills `costs` with the
start-up figures for this (machine, target, dtype, device, block): read from
`cache_dir()/calibration/<key>.json` when stored less than `MAX_AGE_S` ago, else measured by
`costs.calibrate` and stored (atomically); any change of the key (CPU, cores, threads, torch, device,
the target's config and first weights, dtype and how a pass computes in it: the float32 LM head
of a reduced-precision target, `--exact-verify`'s attention; block) or `DFLASH2_RECALIBRATE=1` measures again.
`refresh(costs)`: when `costs.stale()`, the observed figures replace the stored ones (the
measurement's age kept). An unreadable or unwritable cache, or a stored table without the plain
step or a wider pass, is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash2.files.cache import RECALIBRATE_ENV, cache_dir
from dflash2.files.atomic import atomic_write
from dflash2.runtime.provenance import cpu_model

MAX_AGE_S = 7 * 24 * 3600        # a stored calibration older than this is measured again
FORMAT = 2


def calibration_key(target, block: int) -> str:
    device = target.device
    model = target.model
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

    def read(self) -> dict[tuple[int, int], float] | None:
        """The stored figures, or None: none stored, unreadable, another format, or too old."""
        try:
            stored = json.loads(self.path.read_text(encoding="utf-8"))
            measured_at = float(stored["measured_at"])
            table = {(int(b), int(q)): float(s) for b, q, s in stored["verify"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if stored.get("format") != FORMAT or not 0 <= time.time() - measured_at <= MAX_AGE_S:
            return None
        if not any(q == 1 for _, q in table) or not any(q > 1 for _, q in table):
            return None     # a table without a plain step, or with nothing else, cannot weigh the choice
        self.measured_at = measured_at
        return table

    def write(self, table: dict[tuple[int, int], float]) -> None:
        record = {"format": FORMAT, "measured_at": self.measured_at, "written_at": time.time(),
                  "verify": [[b, q, s] for (b, q), s in sorted(table.items())]}
        try:
            with atomic_write(self.path, "w") as handle:
                json.dump(record, handle)
        except OSError:
            pass  # a read-only or full cache: the figures still serve this run

    def refresh(self, costs) -> bool:
        """Store what this run observed in place of a calibration it contradicts; True if it did."""
        if not costs.stale():
            return False
        self.write(costs.adopt_observed())
        return True


def calibrate_cached(costs, target, block: int) -> StoredCalibration:
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
