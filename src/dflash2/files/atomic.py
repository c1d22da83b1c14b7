"""Atomic file and directory writes, and the one rule for a command's output directory.

Contract:
- Nothing a user already has is ever left half-written. `atomic_write` (an open handle) and
  `atomic_file` (a path, for writers that want a file name) write through a temporary file in the
  same directory and rename it into place; `atomic_directory` builds a whole
  directory beside the destination and swaps it in only when everything inside was written (an
  existing destination is replaced: callers own it, or asked for it through
  `refuse_existing_output`). Both leave modes as the user's umask makes them (files
  0666 & ~umask, directories 0777 & ~umask), like any ordinary new file. An `OSError` (a full or
  read-only file system) names the user's path, never the hidden temporary one.
- `refuse_existing_output(path, force, flag, force_flag, writes)` is the one rule for every
  command that writes a directory: a new or empty directory is fine, a file is refused, a
  non-empty directory is refused unless the user passed `force_flag`; even then the command
  replaces only what it writes there (`writes`, named in the message), never anything else.
  `require_creatable(path, flag)` is its check for a path that does not exist yet (none of its
  parents may be a file), and `require_writable(path, flag)` checks, before any work, that the
  file system lets this process write there (the path, or its nearest existing folder: a
  read-only mount or a folder without write permission is refused).
- `remove_own(directory, names)` removes exactly the named entries of `directory` (a command's own
  outputs, on the user's explicit request), nothing else.
- `remove_stale_temporaries(directory, names)` removes what an interrupted (killed) write of one
  of `names` left behind: only entries of exactly our temporary pattern, `.<name>.<8 chars>.tmp`
  and `.<name>.old` (optionally only those untouched for a while), never anything a user made.
- `write_json(path, obj)` / `write_text(path, text)` write a report atomically;
  `markdown_table(headers, rows)` renders its tables (`fmt`: None as "–", floats to 2 digits).
- `check_output(path, flag)`: an output directory that must be new or a directory (bench, analyze).
- `sha256_file(path)`: the hex sha256 of a file, read in chunks.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator

from dflash2.errors import DFlash2Error, require

_TEMP_SUFFIX = r"\.[a-z0-9_]{8}\.tmp"  # what mkstemp / mkdtemp add between our prefix and suffix


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(root: Path) -> None:
    """Give a finished temporary file or tree the modes of ordinary new ones (mkstemp / mkdtemp make
    0600 / 0700, and some writers copy those)."""
    mask = _umask()
    if root.is_dir():
        for folder, dirs, files in os.walk(root):
            os.chmod(folder, 0o777 & ~mask)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o666 & ~mask)
    else:
        os.chmod(root, 0o666 & ~mask)


def _user_path(err: OSError, tmp_prefix: str, path: Path) -> OSError:
    """`err` with a file name inside our temporary file or tree replaced by the user's `path`."""
    name = str(err.filename or "")
    if not name.startswith(tmp_prefix):
        return err
    rest = name[len(tmp_prefix):]
    inside = rest.split(os.sep, 1)[1] if os.sep in rest else ""
    return type(err)(err.errno, err.strerror, str(path / inside) if inside else str(path))


@contextlib.contextmanager
def _user_named_errors(tmp_prefix: str, path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as err:
        renamed = _user_path(err, tmp_prefix, path)
        if renamed is err:
            raise
        raise renamed from None


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path` for a writer that wants a file name; on success the
    file is synced, given the usual mode and renamed over `path`."""
    path = Path(path).absolute()
    with _user_named_errors(str(path.parent / f".{path.name}."), path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield from _finish_file(tmp, path)


def _finish_file(tmp: Path, path: Path) -> Iterator[Path]:
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _publish(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Open a temporary file next to `path`; on success it is renamed over `path` (`atomic_file`)."""
    with atomic_file(path) as tmp:
        with open(tmp, mode) as handle:
            yield handle


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it replaces `path` (an old one is removed)."""
    path = Path(path).resolve()
    with _user_named_errors(str(path.parent / f".{path.name}."), path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        yield from _finish_directory(tmp, path)


def _finish_directory(tmp: Path, path: Path) -> Iterator[Path]:
    try:
        yield tmp
        _publish(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def require_creatable(path: str | os.PathLike, flag: str) -> None:
    """Refuse a new path that lies below a file (`out.txt/run`), or a symbolic link (the path or one
    above it) that leads nowhere (a loop, a missing target): no directory can be made there."""
    nowhere = next((p for p in (Path(path), *Path(path).parents) if p.is_symlink() and not p.exists()), None)
    require(nowhere is None, f"{flag} '{path}': '{nowhere}' is a symbolic link that leads nowhere (a loop or a "
                             "missing target); choose another path")
    blocking = next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)
    require(blocking is None, f"{flag} '{path}': '{blocking}' is a file, not a directory; choose another path")


def require_writable(path: str | os.PathLike, flag: str) -> None:
    path = Path(path)
    require_creatable(path, flag)
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    require(os.access(existing, os.W_OK), f"{flag} '{path}': '{existing}' is not writable (a read-only file system "
                                          "or no permission); choose another path")


def refuse_existing_output(path: str | os.PathLike, force: bool, flag: str, force_flag: str, writes: str) -> None:
    """Raise a one-line `DFlash2Error` unless the command may write its outputs (`writes`) into `path`."""
    path = Path(path)
    if not path.exists():
        require_writable(path, flag)
        return
    require(path.is_dir(), f"{flag} '{path}' exists and is not a directory; choose a new directory")
    require_writable(path, flag)
    if force or not any(path.iterdir()):
        return
    raise DFlash2Error(f"{flag} '{path}' already exists and is not empty; choose a new directory, or pass "
                       f"{force_flag} to replace {writes} there (nothing else in it is touched)")


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)


def remove_own(directory: str | os.PathLike, names: Iterable[str]) -> list[str]:
    """Remove the named entries of `directory` (files or folders); returns the names removed."""
    removed = [name for name in names if os.path.lexists(Path(directory) / name)]
    for name in removed:
        _remove(Path(directory) / name)
    return removed


def remove_stale_temporaries(directory: str | os.PathLike, names: str, min_age_s: float = 0.0) -> list[str]:
    """Remove the leftovers of killed atomic writes of the entries whose names match the regular
    expression `names` (e.g. r"step-\\d{8}"), untouched for at least `min_age_s` seconds (where
    another process may be writing one right now); returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    pattern = re.compile(rf"\.(?:{names})(?:{_TEMP_SUFFIX}|\.old)")
    now = time.time()
    stale = sorted(entry.name for entry in directory.iterdir()
                   if pattern.fullmatch(entry.name) and now - entry.lstat().st_mtime >= min_age_s)
    for name in stale:
        _remove(directory / name)
    return stale


def check_output(path: str, flag: str = "--output") -> None:
    """An output directory of bench / analyze: new or a directory (they write only their own files there)."""
    require(not Path(path).exists() or Path(path).is_dir(), f"{flag} '{path}' exists and is not a directory")
    require_writable(path, flag)


def write_json(path: str | os.PathLike, obj) -> None:
    with atomic_write(path, "w") as handle:
        json.dump(obj, handle, indent=2, default=str)
        handle.write("\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as handle:
        handle.write(text)


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()
