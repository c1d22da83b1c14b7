"""Which device a command runs on and in which precision, both decided before anything loads.

Contract:
- `check_device(text)` -> the device as torch spells it ("cpu", "cuda", "cuda:1", "mps", "xpu:0"),
  or one-line `DFlash2Error` for a name torch does not know, a kind dflash2 does not decode on
  (meta, ...), a kind this torch build lacks (cuda on a CPU-only build), or one this machine lacks
  (no visible GPU, `cuda:3` with one GPU, mps off macOS). It reads what torch reports and loads
  nothing.
- `native_bfloat16(device)` -> (bool, why): whether the device computes bfloat16 natively: CUDA
  with compute capability 8.0 or more (Ampere and later), CPUs with `avx512_bf16` or AMX
  (`amx_bf16`) in /proc/cpuinfo, or the Armv8.6 `bf16` extension, with oneDNN in this torch build.
  Anything else (older GPUs, AVX2 CPUs, mps, xpu) is False.
- `resolve_precision(dtype, device)` -> `Precision`: `auto` (the default of every command and of
  `pipeline.load_decoder`) is bfloat16 where `native_bfloat16` holds, float32 elsewhere; any
  other name (`dtypes.DTYPES`) is taken as given. A CUDA device without bfloat16 (pre-Ampere)
  gets float32, not float16: float16's range (65504) overflows the activations of many current
  models (Gemma, Qwen), where `auto` must never change what the target says; `--dtype float16`
  remains there to ask for. `Precision.name` is the torch name ("bfloat16"), `.reason` why
  (`auto: this CPU has avx512_bf16`), `.describe()` both in one phrase for headers, `.record()`
  the dict saved in results files; `.weights` is how the target's layers keep their weights
  ("float", or "int8" / "int4" with `--weights`, `model.quantized`), in both.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash2.runtime.dtypes import DTYPES
from dflash2.errors import DFlash2Error, require

AUTO = "auto"
DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu")          # the kinds dflash2 decodes on
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")       # x86 flags of native bf16 dot products
_CANONICAL = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _kind_available(kind: str) -> tuple[bool, str]:
    """Whether this torch build and machine have devices of `kind`, and if not, why."""
    if kind == "cpu":
        return True, ""
    if kind == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return False, f"this torch build ({torch.__version__}) has no CUDA support"
        if not torch.cuda.is_available():
            return False, "no CUDA device is visible to this process"
        return True, ""
    if kind == "mps":
        if not torch.backends.mps.is_built():
            return False, f"this torch build ({torch.__version__}) has no MPS support (Apple silicon, macOS)"
        if not torch.backends.mps.is_available():
            return False, "MPS is not available on this machine (it needs Apple silicon and macOS 12.3 or later)"
        return True, ""
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return False, f"this torch build ({torch.__version__}) or machine has no Intel XPU"
    return True, ""


def _device_count(kind: str) -> int | None:
    if kind == "cuda":
        return torch.cuda.device_count()
    if kind == "xpu":
        return torch.xpu.device_count()
    return None


def check_device(text: str) -> str:
    """The device named by `text`, checked against this torch build and machine (see the contract)."""
    name = str(text).strip()
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise DFlash2Error(f"unknown device '{text}' (use cpu, cuda, cuda:N, mps or xpu)") from None
    require(device.type in DEVICE_KINDS,
            f"device '{text}' is not one dflash2 decodes on (use cpu, cuda, cuda:N, mps or xpu)")
    available, why = _kind_available(device.type)
    require(available, f"device '{text}' is not available: {why}; use --device cpu")
    count = _device_count(device.type)
    if device.index is not None and count is not None:
        require(device.index < count, f"device '{text}' does not exist: this machine has {count} "
                                      f"{device.type} device(s), {device.type}:0 to {device.type}:{count - 1}")
    return str(device)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo: x86 `flags`, Arm `Features`); empty elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key = line.split(":", 1)[0].strip()
            if key in ("flags", "Features"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bfloat16(device: str) -> tuple[bool, str]:
    """Whether `device` computes bfloat16 natively, and the evidence in a few words."""
    kind = torch.device(device).type
    if kind == "cuda":
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        if major >= 8:
            return True, f"{name} (compute capability {major}.{minor}) computes bfloat16"
        return False, f"{name} (compute capability {major}.{minor}) has no bfloat16 units"
    if kind != "cpu":
        return False, f"bfloat16 on {kind} is not measured by dflash2"
    if not torch.backends.mkldnn.is_available():
        return False, "this torch build has no oneDNN (its bfloat16 kernels)"
    flags = cpu_flags()
    found = [flag for flag in _CPU_BF16_FLAGS if flag in flags]
    if found:
        return True, f"this CPU has {' and '.join(found)}"
    if platform.machine().lower() in ("aarch64", "arm64") and "bf16" in flags:
        return True, "this CPU has the Arm bf16 extension"
    return False, "this CPU has no bfloat16 dot-product instructions (avx512_bf16, AMX, Arm bf16)"


@dataclass(frozen=True)
class Precision:
    name: str            # the torch name: float32, bfloat16, float16
    requested: str       # what the user asked for: auto, or a name
    reason: str          # why this one
    weights: str = "float"   # the target's layer weights: float (at `name`), int8 or int4

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    def describe(self) -> str:
        weights = "" if self.weights == "float" else f", {self.weights} weights"
        return f"{self.name} ({self.reason}){weights}"

    def record(self) -> dict:
        return {"dtype": self.name, "dtype_requested": self.requested, "dtype_reason": self.reason,
                "weights": self.weights}


def resolve_precision(dtype: str, device: str) -> Precision:
    """`dtype` (auto or a `DTYPES` name) for `device` (already checked) -> `Precision`."""
    requested = str(dtype).strip().lower()
    if requested != AUTO:
        require(requested in DTYPES, f"unknown dtype '{dtype}' (choose from auto, float32, bfloat16, float16)")
        return Precision(_CANONICAL[DTYPES[requested]], requested, "as asked")
    native, why = native_bfloat16(device)
    if native:
        return Precision("bfloat16", AUTO, f"auto: {why}")
    return Precision("float32", AUTO, f"auto: {why}")


def settle(device: str, dtype: str) -> tuple[str, Precision]:
    """`check_device` then `resolve_precision`: what every command does with its two options first."""
    checked = check_device(device)
    return checked, resolve_precision(dtype, checked)
