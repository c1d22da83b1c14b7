"""The cost model's start-up calibration, stored per machine, target and dtype.

Contract: `calibrate_cached(costs, target, block)` fills `costs` (a `CostModel`) with the
start-up figures for this (machine, target, dtype, device, block): read from
`cache_dir()/calibration/<key>.json` when an earlier run stored them, else measured by
`costs.calibrate(target, block)` and stored (atomically). The key covers the CPU model, usable
cores, torch's thread count and version, the device (and GPU name), the target's config and a
fingerprint of its first weights, the dtype and the block; a change in any is a fresh
measurement, and so is `DFLASH2_RECALIBRATE=1`. A cache that cannot be read or written is
ignored (the figures are measured, as without a cache). The running decode refines the figures
as before (`observe_*`), so a stored calibration only saves the start-up passes.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform

import torch

from dflash2.cache import cache_dir
from dflash2.fileio import atomic_write

RECALIBRATE_ENV = "DFLASH2_RECALIBRATE"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibration_key(target, block: int) -> str:
    device = target.device
    model = target.model
    first = next(model.parameters()).detach().reshape(-1)[:64].float().cpu()
    identity = {
        "cpu": _cpu_model(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "config": model.config.to_json_string(use_diff=False), "weights": first.numpy().tobytes().hex(),
        "dtype": str(target.dtype), "block": block,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def calibrate_cached(costs, target, block: int) -> None:
    path = cache_dir() / "calibration" / f"{calibration_key(target, block)}.json"
    if os.environ.get(RECALIBRATE_ENV) != "1":
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            for b, q, seconds in stored["verify"]:
                costs.observe_verify(int(b), int(q), float(seconds))
            if costs.calibrated:
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none stored yet, or unreadable: measure
    costs.calibrate(target, block)
    try:
        with atomic_write(path, "w") as handle:
            json.dump({"verify": [[b, q, s] for (b, q), s in sorted(costs.verify_s.items())]}, handle)
    except OSError:
        pass  # a read-only or full cache: the figures still serve this run
