"""Weight files: reading and checking them without a model, and writing them.

Contract:
- `safetensors_header(path, what)` reads only the header of a `.safetensors` file and returns
  {tensor name: (dtype, shape)}; an empty, truncated or foreign file raises a one-line
  `DFlash2Error` that names the file and says what is wrong with it (`what` says whose weights they
  are, e.g. "draft 'my-draft'"), before anything loads it.
- `weight_files(draft)`: a checkpoint directory's safetensors files, each header-checked (none,
  empty, truncated: one line); `stored_dtype(draft)`: the one dtype they store (float32 if mixed).
- `require_finite(name, tensor, what)` refuses a floating tensor holding NaN or infinite values,
  naming the tensor.
- `save_safetensors(state, path)` and `save_torch(obj, path)` write like
  `safetensors.torch.save_file` and `torch.save`, but a write the operating system refuses (a full
  disk, a read-only file system, a quota) raises the `OSError` it raised (errno, strerror, `path`),
  which the CLI prints as one line; the libraries themselves turn it into `SafetensorError("...
  I/O error: No space left on device (os error 28)")` or a `RuntimeError` from torch's zip writer.
  Any other failure of the libraries propagates unchanged.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from dflash2.errors import DFlash2Error, require

_MAX_HEADER = 100_000_000  # the safetensors format's own limit


def safetensors_header(path: str | Path, what: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    path = Path(path)
    size = path.stat().st_size
    where = f"{what}: weights file '{path}'"
    require(size > 0, f"{where} is empty (an interrupted download or copy?); replace it")
    require(size >= 8, f"{where} is truncated ({size} bytes); replace it")
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        require(0 < length <= _MAX_HEADER, f"{where} is not a safetensors file (header length {length})")
        require(8 + length <= size, f"{where} is truncated: {size} bytes, its header alone needs {8 + length}")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DFlash2Error(f"{where} is not a safetensors file (its header is not JSON)") from None
    require(isinstance(header, dict), f"{where} is not a safetensors file (its header is not a JSON object)")
    tensors, end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        require(isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and isinstance(entry.get("shape"), list),
                f"{where} has a malformed header entry for tensor '{name}'")
        tensors[name] = (str(entry.get("dtype")), tuple(entry["shape"]))
        end = max(end, offsets[1])
    data = size - 8 - length
    require(end <= data, f"{where} is truncated: {size} bytes, its tensors need {8 + length + end}; replace it")
    return tensors


def require_finite(name: str, tensor: torch.Tensor, what: str) -> None:
    # one float64 sum first (several times faster than isfinite on bfloat16): a NaN or inf anywhere makes
    # it NaN or inf, and finite 16- or 32-bit values cannot overflow it; a float64 sum that overflowed
    # is told apart by the element-wise check
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor.sum(dtype=torch.float64))):
        return
    if not bool(torch.isfinite(tensor).all()):
        bad = "NaN" if bool(torch.isnan(tensor).any()) else "infinite"
        raise DFlash2Error(f"{what}: tensor '{name}' holds {bad} values; the checkpoint is damaged "
                           "(a diverged training run?); use an earlier checkpoint or retrain")


STORED_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def weight_files(draft: Path) -> list[Path]:
    """The draft's safetensors files, each checked (empty, truncated, not safetensors: one line)."""
    files = sorted(draft.glob("*.safetensors"))
    require(bool(files), f"draft checkpoint '{draft}' has no model.safetensors")
    for file in files:
        safetensors_header(file, f"draft checkpoint '{draft}'")
    return files


def stored_dtype(draft: Path) -> str:
    """The one dtype the checkpoint's tensors are stored in (float32 when mixed or unknown)."""
    kinds = set()
    for file in weight_files(draft):
        kinds |= {dtype for dtype, _ in safetensors_header(file, str(draft)).values()} & set(STORED_DTYPES)
    return STORED_DTYPES.get(kinds.pop(), "float32") if len(kinds) == 1 else "float32"

_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def save_safetensors(state: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict | None = None) -> None:
    try:
        save_file(state, str(path), metadata={"format": "pt"} if metadata is None else metadata)
    except SafetensorError as err:
        found = _OS_ERROR.search(str(err))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


class _RecordingWriter:
    """A file handle that remembers the OSError of a failed write (torch's writer hides it)."""

    def __init__(self, handle):
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as err:
            self.error = err
            raise


def save_torch(obj, path: str | os.PathLike) -> None:
    with open(path, "wb") as handle:
        writer = _RecordingWriter(handle)
        try:
            torch.save(obj, writer)
            handle.flush()
            os.fsync(handle.fileno())
        except RuntimeError:
            if writer.error is None:
                raise
            raise OSError(writer.error.errno, writer.error.strerror, str(Path(path))) from None
