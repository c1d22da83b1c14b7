"""Where a result came from: the code (its git commit) and the machine it ran on.

Contract:
- `git_commit(path=None)` names the commit of the working tree around `path` (default: this
  package), with "+dirty" when it has uncommitted changes; None outside git.
- `cpu_model()` is the CPU's model name. `machine_identity()` is what timings depend on (CPU, cores, torch threads, bf16, GPU);
  `machine_info()` adds platform, library versions and the load average; `machine_line(info)` says
  it in one line for reports.
- `cpu_ticks()` reads (stolen, all) CPU ticks since boot (Linux), None elsewhere;
  `steal_share(start, end)` is the share of ticks between two readings that the hypervisor gave
  to other guests.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch
import transformers

from dflash2.runtime.devices import native_bfloat16


def git_commit(path: str | Path | None = None) -> str | None:
    where = str(path or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_identity() -> dict:
    """What timings depend on, for deciding whether saved bench parts came from the same kind of machine."""
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_bf16": native_bfloat16("cpu")[0],
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def machine_info() -> dict:
    """`machine_identity()` plus platform, library versions and the load average."""
    return dict(machine_identity(), platform=platform.platform(), torch=torch.__version__,
                transformers=transformers.__version__, python=platform.python_version(),
                load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)


def machine_line(info: dict) -> str:
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"
    return (f"{info['cpu']}, {info['cpu_count']} CPU cores ({info['torch_threads']} torch threads){gpu}; "
            f"torch {info['torch']}, transformers {info['transformers']}")


def cpu_ticks() -> tuple[int, int] | None:
    """(stolen, all) CPU ticks since boot from Linux /proc/stat (steal: time the hypervisor gave to
    other guests while this one wanted to run); None where there is no such file."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the CPU's ticks between two `cpu_ticks()` readings that was stolen."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])
