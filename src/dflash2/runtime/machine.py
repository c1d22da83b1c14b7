"""What this machine can honour: thread counts and memory, checked before anything loads.

Contract:
- `check_threads(n, flag="--threads")` refuses (one-line `DFlash2Error`, before anything
  loads) a count below 1 or above `MAX_OVERSUBSCRIPTION` times this process's usable CPU cores
  (torch's thread pools segfault on counts in the tens of thousands, and far above the core count
  threads only contend); a count above the core count but within that bound is allowed and
  returns a one-line warning (`# warning: ...`) for the caller to print; None (torch's choice) and
  counts within the cores return None. `announce_threads(n, flag)` checks and prints that warning
  to stderr; `use_threads(n)` then hands a given count to torch (None leaves torch's choice).
- `busy_warning(threads, load=None)`: a one-line warning (`# warning: ...`) when more than one torch
  thread runs on a machine already busy (a load average, default `os.getloadavg()`, of at least
  its usable cores), else None: the threads wait on each other (on a 2-core host beside two other
  jobs the yardstick's draft pass ran 7-17 times slower at 2 threads than at 1), so a measurement
  is far steadier at `--threads 1`. Measuring commands print it before they start, through
  `warn_if_busy(device)` (CPU devices only: an accelerator does not share the host's cores).
- `available_memory()`: bytes of memory the kernel says a new allocation can take without
  swapping (MemAvailable), or None where it does not say. `require_memory(nbytes, what, hint)`
  refuses (one line) an allocation larger than that.
"""
from __future__ import annotations

import os
import sys

from dflash2.errors import require

MAX_OVERSUBSCRIPTION = 4


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def require_memory(nbytes: int, what: str, hint: str) -> None:
    free = available_memory()
    require(free is None or nbytes <= free,
            f"{what} needs about {nbytes / 2**30:.1f} GiB of memory, but this machine has "
            f"{(free or 0) / 2**30:.1f} GiB available; {hint}")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. under taskset or a container)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def busy_warning(threads: int, load: float | None = None) -> str | None:
    cores = usable_cores()
    if load is None and hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
    if threads <= 1 or load is None or load < cores:
        return None
    return (f"# warning: this machine is busy (load average {load:.1f} on {cores} CPU cores): {threads} torch threads "
            "will wait on each other and can run many times slower; --threads 1 is steadier")


def check_threads(n: int | None, flag: str = "--threads") -> str | None:
    if n is None:
        return None
    cores = usable_cores()
    require(n >= 1, f"{flag} must be positive, got {n}")
    require(n <= MAX_OVERSUBSCRIPTION * cores,
            f"{flag} {n} is more than this machine can run: it has {cores} usable CPU core(s), and more than "
            f"{MAX_OVERSUBSCRIPTION * cores} threads only contend (very large counts crash torch); use at most {cores}")
    if n > cores:
        return (f"# warning: {flag} {n} is above the {cores} usable CPU core(s) of this machine: the threads will "
                f"contend and run slower than {cores} would")
    return None


def announce_threads(n: int | None, flag: str = "--threads") -> None:
    warning = check_threads(n, flag)
    if warning:
        print(warning, file=sys.stderr)


def use_threads(n: int | None) -> None:
    if n is not None:
        import torch
        torch.set_num_threads(n)


def warn_if_busy(device: str) -> None:
    if str(device).startswith("cpu"):
        import torch
        busy = busy_warning(torch.get_num_threads())
        if busy:
            print(busy, file=sys.stderr)
