"""Compressed token-id shards of regenerated training data, with a manifest.

Contract:
- A `Record` is one training sequence: the prompt's source id (e.g. "sharegpt:abc_0"), the prompt
  token ids, the response token ids (the part the loss is on) and the finish reason ("stop" or
  "length"). `record.loss_mask()` rebuilds the loss mask (True on response tokens only) over
  `record.tokens` = prompt + response.
- A data directory holds `shard-00000.npz`, `shard-00001.npz`, ... and `manifest.json`. A shard is
  `np.savez_compressed` of: `tokens` (int32, every record's prompt + response, concatenated),
  `offsets` (int64, n + 1 record boundaries into `tokens`), `prompt_lengths` (int32, n),
  `finish_reasons` (int8 codes into `FINISH_REASONS`) and `ids` (unicode strings). No pickles.
- `ShardWriter(out_dir, manifest_fields, shard_size=256, run=None)` buffers records and writes a
  shard every `shard_size` records (`add`), on `flush`, and on `close` (also as a context
  manager, even when the block raises). Each shard is written atomically, then the manifest is
  rewritten atomically, so an interruption loses at most the records not yet flushed; a shard file
  that never made it into the manifest is ignored and later overwritten. A first session that
  raises before storing any record removes its manifest (and the directory, if it made it).
- The manifest holds the format version, the dflash2 version, creation / update times, the
  caller's `manifest_fields` (target, tokenizer, prompts, sampling, ...: free-form JSON), the
  counts (records, prompt tokens, response tokens, finish reasons), one entry per shard (file name,
  record count, sha256) and `runs`, one entry per writer session (`run` plus records added).
- Reopening an existing directory continues it: every key of `manifest_fields` must equal the
  manifest's value (else a one-line `DFlash2Error` names the first differing field), and a record
  whose id is already stored is refused. A non-empty directory without a manifest is refused.
  One writer at a time: the directory is locked (`.writer.lock`, removed on close).
- `InOrder(writer, ids)` hands records to a writer in the order of `ids` whatever order they are
  finished in (`put(id, record)`; `record=None`: that id is given up), holding back the ones whose
  turn has not come; `drain()` (an interruption, or the end) writes what is held, in order, past the
  gaps. Regeneration writes through it, so the same prompts give the same shard bytes whatever the
  batch size or the number of concurrent requests (shard files are byte-deterministic: fixed
  timestamps in the archive).
- `check_output_dir(dir)`: whether a directory can take shards (new, empty, or a shard directory),
  without writing anything. `load_manifest(dir)` reads and checks a manifest; `read_records(dir)` yields every stored record
  in shard order (checking each shard's sha256 and record count); `done_ids(dir)` is the set of
  stored ids (empty for a missing or empty directory), used to resume.
- Every bad or inconsistent directory raises `DFlash2Error` with a one-line message.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from dflash2 import __version__
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_write, require_creatable

FORMAT = "dflash2-token-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LOCK = ".writer.lock"
FINISH_REASONS = ("stop", "length")
_SHARD_NAME = re.compile(r"shard-(\d{5,})\.npz")
_ARRAYS = ("tokens", "offsets", "prompt_lengths", "finish_reasons", "ids")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)   # the earliest time a zip member can carry


@dataclass
class Record:
    """One prompt and the target's response to it, as token ids."""

    id: str
    prompt: np.ndarray      # int32 [prompt_length]
    response: np.ndarray    # int32 [response_length]
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        self.prompt = np.asarray(self.prompt, dtype=np.int32).reshape(-1)
        self.response = np.asarray(self.response, dtype=np.int32).reshape(-1)

    @property
    def prompt_length(self) -> int:
        return int(self.prompt.size)

    @property
    def tokens(self) -> np.ndarray:
        """Prompt followed by response: the model's input sequence."""
        return np.concatenate([self.prompt, self.response])

    def loss_mask(self) -> np.ndarray:
        """Boolean mask over `tokens`: True on response tokens (the only ones the loss is on)."""
        return loss_mask(self.prompt_length, self.prompt_length + int(self.response.size))


def loss_mask(prompt_length: int, total_length: int) -> np.ndarray:
    """Loss mask of a stored sequence from its prompt length: False on the prompt, True after."""
    mask = np.zeros(total_length, dtype=bool)
    mask[prompt_length:] = True
    return mask


# --------------------------------------------------------------------------- manifest

def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_manifest(data_dir: str | os.PathLike) -> dict:
    """The checked manifest of a data directory."""
    path = Path(data_dir) / MANIFEST
    require(path.is_file(), f"{data_dir} is not a dflash2 shard directory: {MANIFEST} is missing")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DFlash2Error(f"{path} is unreadable: {str(error).splitlines()[0]}") from None
    require(isinstance(manifest, dict) and manifest.get("format") == FORMAT,
            f"{path} is not a dflash2 token-shard manifest")
    version = manifest.get("format_version")
    require(version == FORMAT_VERSION,
            f"{path} has format version {version!r}; this dflash2 reads version {FORMAT_VERSION}")
    shards, counts = manifest.get("shards"), manifest.get("counts")
    require(isinstance(shards, list) and isinstance(counts, dict), f"{path} lacks its shards or counts")
    for shard in shards:
        require(isinstance(shard, dict) and _SHARD_NAME.fullmatch(str(shard.get("file", "")))
                and isinstance(shard.get("records"), int) and isinstance(shard.get("sha256"), str),
                f"{path} has a malformed shard entry: {shard!r}")
    stored = sum(shard["records"] for shard in shards)
    require(counts.get("records") == stored,
            f"{path} counts {counts.get('records')} records but its shards hold {stored}")
    return manifest


def _empty_counts() -> dict:
    return {"records": 0, "prompt_tokens": 0, "response_tokens": 0,
            "finish_reasons": {reason: 0 for reason in FINISH_REASONS}}


def _first_difference(old, new, path: str = "") -> str | None:
    """Dotted path of the first place where two JSON values differ (None when equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    return None if old == new else (path or "<root>")


def _lookup(value, dotted: str):
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


# --------------------------------------------------------------------------- shard files

def _encode_shard(records: list[Record]) -> bytes:
    lengths = [r.prompt_length + int(r.response.size) for r in records]
    arrays = {
        "tokens": np.concatenate([r.tokens for r in records]).astype(np.int32),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "prompt_lengths": np.array([r.prompt_length for r in records], dtype=np.int32),
        "finish_reasons": np.array([FINISH_REASONS.index(r.finish_reason) for r in records], dtype=np.int8),
        "ids": np.array([r.id for r in records], dtype=np.str_),
    }
    # np.savez_compressed's layout (one `NAME.npy` member per array, deflated), with a fixed member
    # timestamp instead of the clock's, so that equal records give equal bytes
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            member = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            member.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(member, "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, array, allow_pickle=False)
    return buffer.getvalue()


def _decode_shard(data: bytes, where: str) -> list[Record]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in _ARRAYS}
    except Exception as error:  # zip, key or pickle errors from a damaged file
        raise DFlash2Error(f"{where} is not a readable shard: {type(error).__name__}: {error}") from None
    tokens, offsets, prompt_lengths = arrays["tokens"], arrays["offsets"], arrays["prompt_lengths"]
    codes, ids = arrays["finish_reasons"], arrays["ids"]
    n = len(ids)
    require(offsets.shape == (n + 1,) and prompt_lengths.shape == (n,) and codes.shape == (n,)
            and offsets[0] == 0 and offsets[-1] == tokens.size and bool(np.all(np.diff(offsets) >= 0))
            and bool(np.all((prompt_lengths >= 0) & (prompt_lengths <= np.diff(offsets))))
            and bool(np.all((codes >= 0) & (codes < len(FINISH_REASONS)))),
            f"{where} has inconsistent arrays (offsets, prompt lengths or finish reasons)")
    records = []
    for i in range(n):
        start, split, end = int(offsets[i]), int(offsets[i] + prompt_lengths[i]), int(offsets[i + 1])
        records.append(Record(str(ids[i]), tokens[start:split], tokens[split:end], FINISH_REASONS[codes[i]]))
    return records


def _read_shard(data_dir: Path, entry: dict, verify: bool) -> list[Record]:
    path = data_dir / entry["file"]
    require(path.is_file(), f"{path} is listed in the manifest but missing")
    data = path.read_bytes()
    if verify:
        require(_sha256(data) == entry["sha256"], f"{path} does not match its sha256 in the manifest")
    records = _decode_shard(data, str(path))
    require(len(records) == entry["records"],
            f"{path} holds {len(records)} records; the manifest says {entry['records']}")
    return records


def read_records(data_dir: str | os.PathLike, verify: bool = True) -> Iterator[Record]:
    """Every stored record, in shard order (each shard's sha256 checked unless verify=False)."""
    data_dir = Path(data_dir)
    for entry in load_manifest(data_dir)["shards"]:
        yield from _read_shard(data_dir, entry, verify)


def done_ids(data_dir: str | os.PathLike) -> set[str]:
    """Ids already stored (for resuming); empty when the directory is missing or empty."""
    data_dir = Path(data_dir)
    if not (data_dir / MANIFEST).exists() and not _visible_files(data_dir):
        return set()
    ids: set[str] = set()
    for record in read_records(data_dir, verify=False):
        require(record.id not in ids, f"{data_dir} stores id {record.id!r} twice")
        ids.add(record.id)
    return ids


def check_output_dir(out_dir: str | os.PathLike) -> None:
    """Raise (one line) unless `out_dir` can take shards: new, empty, or a shard directory whose
    manifest reads (checked before anything slow starts, and again by the writer)."""
    out = Path(out_dir)
    if not out.exists():
        require_creatable(out, "output directory")
        return
    require(out.is_dir(), f"{out} exists and is not a directory; choose an empty or new directory")
    if (out / MANIFEST).exists():
        load_manifest(out)
        return
    require(not _visible_files(out), f"{out} is not empty and has no {MANIFEST}; choose an empty or new directory")


def _visible_files(data_dir: Path) -> list[str]:
    """Names in a directory other than hidden ones (locks, temporary files); [] if it is missing."""
    return sorted(p.name for p in data_dir.iterdir() if not p.name.startswith(".")) if data_dir.is_dir() else []


# --------------------------------------------------------------------------- writer

class ShardWriter:
    """Appends records to a data directory, one compressed shard per `shard_size` records."""

    def __init__(self, out_dir: str | os.PathLike, manifest_fields: dict, shard_size: int = 256,
                 run: dict | None = None):
        require(isinstance(shard_size, int) and shard_size > 0, f"shard_size must be a positive integer, got {shard_size!r}")
        reserved = {"format", "format_version", "dflash2_version", "created_at", "updated_at",
                    "counts", "shards", "runs"} & set(manifest_fields)
        if reserved:
            raise DFlash2Error(f"manifest field {sorted(reserved)[0]!r} is reserved for the writer")
        self.out_dir = Path(out_dir)
        self.shard_size = shard_size
        self.buffer: list[Record] = []
        self.closed = False
        check_output_dir(self.out_dir)
        self._made_dir = not self.out_dir.exists()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._lock = self._acquire_lock()
        try:
            resuming = (self.out_dir / MANIFEST).exists()
            self._fresh = not resuming
            self.manifest = self._open_manifest(manifest_fields)
            self.ids = done_ids(self.out_dir) if resuming else set()
        except BaseException:
            self._release_lock()
            raise
        self.run = {"started_at": _utc_now(), **(run or {}), "records_added": 0}
        self.manifest["runs"].append(self.run)
        self._write_manifest()

    def _acquire_lock(self):
        handle = open(self.out_dir / LOCK, "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise DFlash2Error(f"{self.out_dir} is being written by another process ({LOCK} is locked)") from None
        return handle

    def _release_lock(self) -> None:
        if self._lock is not None:
            (self.out_dir / LOCK).unlink(missing_ok=True)
            self._lock.close()
            self._lock = None

    def _open_manifest(self, fields: dict) -> dict:
        if not (self.out_dir / MANIFEST).exists():
            check_output_dir(self.out_dir)
            now = _utc_now()
            return {"format": FORMAT, "format_version": FORMAT_VERSION, "dflash2_version": __version__,
                    "created_at": now, "updated_at": now, **fields,
                    "counts": _empty_counts(), "shards": [], "runs": []}
        manifest = load_manifest(self.out_dir)
        for key, value in fields.items():
            where = _first_difference(manifest.get(key), json.loads(json.dumps(value)), key)
            if where:
                raise DFlash2Error(
                    f"{self.out_dir} was made with {where} = {json.dumps(_lookup(manifest, where))}, "
                    f"not {json.dumps(_lookup(fields, where))}; use the same settings or another output directory")
        manifest.setdefault("runs", [])
        return manifest

    def _next_file(self) -> str:
        numbers = [int(_SHARD_NAME.fullmatch(s["file"]).group(1)) for s in self.manifest["shards"]]
        return f"shard-{max(numbers, default=-1) + 1:05d}.npz"

    def _write_manifest(self) -> None:
        self.manifest["updated_at"] = _utc_now()
        with atomic_write(self.out_dir / MANIFEST, "w") as handle:
            json.dump(self.manifest, handle, indent=2)
            handle.write("\n")

    def add(self, record: Record) -> None:
        require(not self.closed, "this ShardWriter is closed")
        require(isinstance(record.id, str) and record.id != "", f"record id must be a non-empty string, got {record.id!r}")
        require(record.id not in self.ids, f"record {record.id!r} is already stored in {self.out_dir}")
        require(record.finish_reason in FINISH_REASONS,
                f"finish reason {record.finish_reason!r} is not one of {', '.join(FINISH_REASONS)}")
        self.ids.add(record.id)
        self.buffer.append(record)
        if len(self.buffer) >= self.shard_size:
            self.flush()

    def flush(self) -> str | None:
        """Write the buffered records as one shard, then the manifest; returns the shard's name."""
        if not self.buffer:
            return None
        name = self._next_file()
        data = _encode_shard(self.buffer)
        with atomic_write(self.out_dir / name, "wb") as handle:
            handle.write(data)
        counts = self.manifest["counts"]
        for record in self.buffer:
            counts["records"] += 1
            counts["prompt_tokens"] += record.prompt_length
            counts["response_tokens"] += int(record.response.size)
            counts["finish_reasons"][record.finish_reason] = counts["finish_reasons"].get(record.finish_reason, 0) + 1
        self.manifest["shards"].append({"file": name, "records": len(self.buffer), "sha256": _sha256(data)})
        self.run["records_added"] += len(self.buffer)
        self.run["finished_at"] = _utc_now()
        self.buffer = []
        self._write_manifest()
        return name

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.flush() is None:  # nothing buffered: still record the run's end
                self.run["finished_at"] = _utc_now()
                self._write_manifest()
        finally:
            self.closed = True
            self._release_lock()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
        if exc_info[0] is not None and self._fresh and not self.manifest["shards"]:
            # a first run that failed before storing a record leaves nothing behind: a corrected
            # rerun (other settings) must not be refused as a continuation of it
            (self.out_dir / MANIFEST).unlink(missing_ok=True)
            if self._made_dir and not any(self.out_dir.iterdir()):
                self.out_dir.rmdir()


class InOrder:
    """Records to a `ShardWriter` in a fixed order of ids, whatever order they finish in."""

    def __init__(self, writer: ShardWriter, ids: list[str]):
        self.writer, self.order, self.next = writer, list(ids), 0
        self.held: dict[str, Record | None] = {}

    def put(self, record_id: str, record: Record | None) -> None:
        """`record` (None: `record_id` is given up) is written once every id before it is."""
        self.held[record_id] = record
        while self.next < len(self.order) and self.order[self.next] in self.held:
            ready = self.held.pop(self.order[self.next])
            self.next += 1
            if ready is not None:
                self.writer.add(ready)

    def drain(self) -> None:
        """Write every record still held, in order (the ids between them never came)."""
        for record_id in self.order[self.next:]:
            ready = self.held.pop(record_id, None)
            if ready is not None:
                self.writer.add(ready)
        self.next = len(self.order)
