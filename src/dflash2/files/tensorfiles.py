"""Writing tensor files (safetensors, torch.save) so that a failing file system is an `OSError`.

Contract: `save_safetensors(state, path)` and `save_torch(obj, path)` write like
`safetensors.torch.save_file` and `torch.save`, but a write the operating system refuses (a full
disk, a read-only file system, a quota) raises the `OSError` it raised (errno, strerror, `path`),
which the CLI prints as one line; the libraries themselves turn it into `SafetensorError("...
I/O error: No space left on device (os error 28)")` or a `RuntimeError` from torch's zip writer.
Any other failure of the libraries propagates unchanged.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

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
