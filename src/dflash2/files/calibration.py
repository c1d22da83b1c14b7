"""A cost model's start-up calibration as stored in the cache: one JSON file per machine, target and
numerics, read back while it is young.

Contract: `calibration_path(target, block)`: `cache_dir()/calibration/<key>.json`, the key covering
the CPU, cores, threads, torch, device, the target's config and first weights, its dtype and how a
pass computes in it (the float32 LM head, `--exact-verify`'s attention, `--weights`, the float32
one-row step's kernel), and the block.
`read_calibration(path)` -> ({(b, q): seconds}, measured_at), or None: nothing stored, unreadable,
another format, older than `MAX_AGE_S`, or without both a plain step (q = 1) and a wider pass (such
figures could not weigh speculation against plain decoding). `write_calibration(path, table,
measured_at)` writes atomically; a read-only or full cache is passed over. `StoredCalibration.of(target,
block)`: that file and when its figures were measured; `read()` (nothing under `--recalibrate`),
`write(table)`.
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

MAX_AGE_S = 7 * 24 * 3600        # a stored calibration older than this is measured again
FORMAT = 2

Table = dict[tuple[int, int], float]   # (b, q) -> seconds


def calibration_path(target, block: int) -> Path:
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
                     "exact_verify": bool(getattr(target, "exact_verify", False)),
                     # the forms its projections keep their weights in (model.projections: packed, int4, ...)
                     "weights": sorted({str(m.form) for m in model.modules() if hasattr(m, "form")}),
                     # the float32 one-row step on the packed kernel where it is row-invariant (projections.kernel)
                     "one_row_packed": any(getattr(p, "invariant", False) for m in model.modules()
                                           if hasattr(m, "projections") for p in m.projections())},
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "calibration" / f"{key}.json"


def read_calibration(path: Path) -> tuple[Table, float] | None:
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        measured_at = float(stored["measured_at"])
        table = {(int(b), int(q)): float(s) for b, q, s in stored["verify"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fresh = stored.get("format") == FORMAT and 0 <= time.time() - measured_at <= MAX_AGE_S
    if not fresh or not any(q == 1 for _, q in table) or not any(q > 1 for _, q in table):
        return None
    return table, measured_at


def write_calibration(path: Path, table: Table, measured_at: float) -> None:
    record = {"format": FORMAT, "measured_at": measured_at, "written_at": time.time(),
              "verify": [[b, q, s] for (b, q), s in sorted(table.items())]}
    try:
        with atomic_write(path, "w") as handle:
            json.dump(record, handle)
    except OSError:
        pass  # a read-only or full cache: the figures still serve this run


@dataclass
class StoredCalibration:
    path: Path
    measured_at: float = 0.0    # when the start-up measurement ran (time.time())

    @classmethod
    def of(cls, target, block: int) -> StoredCalibration:
        return cls(calibration_path(target, block), time.time())

    def read(self) -> Table:
        """The stored figures, {} where none serve (or `RECALIBRATE_ENV` asks for new ones)."""
        stored = read_calibration(self.path) if os.environ.get(RECALIBRATE_ENV) != "1" else None
        if stored is None:
            return {}
        table, self.measured_at = stored
        return table

    def write(self, table: Table) -> None:
        write_calibration(self.path, table, self.measured_at)
