"""Large files in parts of bounded size with a sha256 manifest: how the GPU path moves its files.

The device machine gets a copy of the working tree of at most 64 MiB per call (the tree itself
included) and gives back files of at most 16 MiB, so the target's GGUF goes there in parts over
back-to-back calls, and the trained draft comes back in parts. Standard library only, so that the
device's upload calls check their parts in well under a second.

Contract:
- A parts directory holds `<file>.part-00`, `<file>.part-01`, ... and `manifest.json`:
  `{"format": "dflash2-parts", "version": 1, "file", "size", "sha256", "parts": [{"name", "size",
  "sha256"}, ...]}`, plus `"contents": [{"name", "size", "sha256"}, ...]` when the file is a packed
  directory (a tar of its files).
- `split_file(source, out_dir, sizes)` writes the parts (part i holds at most `sizes[i]` bytes, the
  last size repeating; an int is one size for all), removes the parts of the same file left by an
  earlier split, and writes the manifest last, atomically (parts of an interrupted split fail the
  manifest's hashes). Returns the manifest.
- `parts_status(parts_dir)` -> `PartsStatus` (which parts are there with the right size and
  sha256); `join_parts(parts_dir, dest)` writes the whole file atomically after checking every
  part and the whole. A missing manifest or part, a wrong size or a sha256 mismatch is a one-line
  `DFlash2Error` naming the part.
- `pack_directory(src, out_dir, part_bytes)`: the directory's files (flat) as a deterministic tar
  in parts; `unpack_parts(parts_dir, dest)` joins, verifies and extracts them into `dest`
  (atomically; plain file names only, each file's sha256 checked).
- `tree_bytes(repo)`: what one device call sends before any carried path (tracked and untracked,
  not ignored files); `plan_calls(...)` the call sequence that carries wheels and parts within the
  per-call limit (`DeviceCall`s; `scripts/gpu/split_target.sh` prints it).
- CLI: `python -m dflash2.tools.gpu.parts split-target | status | join | collect`
  (`collect PARTS DEST` unpacks a draft and loads it with `DFlash2DraftModel.from_pretrained`).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from dflash2.argparsing import OneLineParser, first_paragraph, run_command
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_directory, atomic_write, sha256_file

MANIFEST = "manifest.json"
FORMAT = "dflash2-parts"
MiB = 1 << 20
CALL_LIMIT = 64 * MiB           # what one device call may send: working tree + carried paths
RETURN_LIMIT = 16 * MiB         # the largest file a device call gives back
SLACK = 64 * 1024               # room in each call for the parts manifest
_CHUNK = 4 * MiB


def part_name(file: str, index: int) -> str:
    return f"{file}.part-{index:02d}"


class _PartWriter(io.RawIOBase):
    """A write-only stream cut into part files of bounded sizes, hashing each part and the whole."""

    def __init__(self, out_dir: Path, file: str, sizes: list[int]):
        super().__init__()
        require(all(s > 0 for s in sizes), "part sizes must be positive")
        self.out_dir, self.file, self.sizes = out_dir, file, sizes
        self.parts: list[dict] = []
        self.whole = hashlib.sha256()
        self.size = 0
        self._handle = None
        self._room = 0

    def writable(self) -> bool:
        return True

    def _limit(self, index: int) -> int:
        return self.sizes[min(index, len(self.sizes) - 1)]

    def _next_part(self) -> None:
        self._finish_part()
        name = part_name(self.file, len(self.parts))
        self._handle = open(self.out_dir / name, "wb")
        self._digest = hashlib.sha256()
        self._room = self._limit(len(self.parts))
        self.parts.append({"name": name, "size": 0, "sha256": ""})

    def _finish_part(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self.parts[-1]["sha256"] = self._digest.hexdigest()
            self._handle = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):
            if self._handle is None or self._room == 0:
                self._next_part()
            piece = view[written:written + self._room]
            self._handle.write(piece)
            self._digest.update(piece)
            self.whole.update(piece)
            self.parts[-1]["size"] += len(piece)
            self._room -= len(piece)
            self.size += len(piece)
            written += len(piece)
        return written

    def close(self) -> None:
        if not self.closed:
            if not self.parts:  # an empty file is one empty part
                self._next_part()
            self._finish_part()
        super().close()


def _write_parts(out_dir: Path, file: str, sizes: int | list[int], fill) -> dict:
    """Parts of `file` written by `fill(stream)`, then the manifest; stale parts removed."""
    require(re.fullmatch(r"[A-Za-z0-9._-]+", file) is not None, f"part file name '{file}' must be plain")
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = _PartWriter(out_dir, file, [sizes] if isinstance(sizes, int) else list(sizes))
    try:
        fill(writer)
    finally:
        writer.close()
    manifest = {"format": FORMAT, "version": 1, "file": file, "size": writer.size,
                "sha256": writer.whole.hexdigest(), "parts": writer.parts,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    keep = {p["name"] for p in writer.parts}
    for stale in out_dir.glob(f"{file}.part-*"):
        if stale.name not in keep and re.fullmatch(re.escape(file) + r"\.part-\d+", stale.name):
            stale.unlink()
    return manifest


def _save_manifest(out_dir: Path, manifest: dict) -> None:
    with atomic_write(out_dir / MANIFEST, "w") as handle:
        json.dump(manifest, handle, indent=2)
        handle.write("\n")


def split_file(source: str | Path, out_dir: str | Path, sizes: int | list[int], name: str | None = None) -> dict:
    """Cut `source` into parts in `out_dir` (see the module contract); returns the manifest."""
    source, out_dir = Path(source), Path(out_dir)
    require(source.is_file(), f"file to split '{source}' does not exist")

    def fill(stream):
        with open(source, "rb") as handle:
            shutil.copyfileobj(handle, stream, _CHUNK)

    manifest = _write_parts(out_dir, name or source.name, sizes, fill)
    _save_manifest(out_dir, manifest)
    return manifest


def read_manifest(parts_dir: str | Path) -> dict:
    path = Path(parts_dir) / MANIFEST
    require(path.is_file(), f"no parts manifest '{path}' (split the file first: scripts/gpu/split_target.sh)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DFlash2Error(f"parts manifest '{path}' is not readable JSON ({err})") from None
    require(isinstance(manifest, dict) and manifest.get("format") == FORMAT and isinstance(manifest.get("parts"), list),
            f"'{path}' is not a {FORMAT} manifest")
    return manifest


@dataclass(frozen=True)
class PartsStatus:
    file: str
    good: tuple[str, ...]
    missing: tuple[str, ...]
    bad: tuple[str, ...] = field(default=())   # present, wrong size or sha256

    @property
    def complete(self) -> bool:
        return not self.missing and not self.bad

    def line(self) -> str:
        total = len(self.good) + len(self.missing) + len(self.bad)
        text = f"parts of {self.file}: {len(self.good)}/{total} present and verified"
        if self.missing:
            text += f"; missing: {', '.join(self.missing)}"
        if self.bad:
            text += f"; damaged (size or sha256): {', '.join(self.bad)}"
        return text


def _part_problem(parts_dir: Path, part: dict) -> str | None:
    path = parts_dir / part["name"]
    if not path.is_file():
        return "missing"
    if path.stat().st_size != part["size"]:
        return f"has {path.stat().st_size} bytes, the manifest says {part['size']}"
    digest = sha256_file(path)
    if digest != part["sha256"]:
        return f"sha256 mismatch (expected {part['sha256'][:16]}..., got {digest[:16]}...)"
    return None


def parts_status(parts_dir: str | Path) -> PartsStatus:
    parts_dir = Path(parts_dir)
    manifest = read_manifest(parts_dir)
    good, missing, bad = [], [], []
    for part in manifest["parts"]:
        problem = _part_problem(parts_dir, part)
        (good if problem is None else missing if problem == "missing" else bad).append(part["name"])
    return PartsStatus(manifest["file"], tuple(good), tuple(missing), tuple(bad))


def join_parts(parts_dir: str | Path, dest: str | Path) -> dict:
    """Check every part, join them into `dest` (atomically) and check the whole; returns the manifest."""
    parts_dir, dest = Path(parts_dir), Path(dest)
    manifest = read_manifest(parts_dir)
    count = len(manifest["parts"])
    for index, part in enumerate(manifest["parts"]):
        problem = _part_problem(parts_dir, part)
        if problem == "missing":
            raise DFlash2Error(f"missing part {part['name']} ({index + 1} of {count}) in '{parts_dir}'")
        require(problem is None, f"part {part['name']} in '{parts_dir}': {problem}")
    whole = hashlib.sha256()
    with atomic_write(dest, "wb") as out:
        for part in manifest["parts"]:
            with open(parts_dir / part["name"], "rb") as handle:
                for block in iter(lambda: handle.read(_CHUNK), b""):
                    whole.update(block)
                    out.write(block)
        require(whole.hexdigest() == manifest["sha256"],
                f"joined {manifest['file']}: sha256 mismatch with the manifest (parts from different splits?)")
    return manifest


# ----------------------------------------------------------------------------- directories
def pack_directory(src: str | Path, out_dir: str | Path, part_bytes: int, name: str = "draft.tar") -> dict:
    """The plain files of `src` as a deterministic tar (sorted names, zero times and owners) in
    parts of at most `part_bytes`; the manifest lists every file's size and sha256."""
    src, out_dir = Path(src), Path(out_dir)
    require(src.is_dir(), f"directory to pack '{src}' does not exist")
    files = sorted(p for p in src.iterdir() if p.is_file())
    require(bool(files), f"directory to pack '{src}' has no files")
    contents = [{"name": p.name, "size": p.stat().st_size, "sha256": sha256_file(p)} for p in files]

    def fill(stream):
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in files:
                info = tarfile.TarInfo(path.name)
                info.size, info.mode, info.mtime = path.stat().st_size, 0o644, 0
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)

    manifest = _write_parts(out_dir, name, part_bytes, fill)
    manifest["contents"] = contents
    _save_manifest(out_dir, manifest)
    return manifest


def unpack_parts(parts_dir: str | Path, dest: str | Path) -> dict:
    """Join and verify packed parts, then extract the files into `dest` (it appears whole)."""
    parts_dir, dest = Path(parts_dir), Path(dest)
    manifest = read_manifest(parts_dir)
    contents = {c["name"]: c for c in manifest.get("contents") or []}
    require(bool(contents), f"'{parts_dir / MANIFEST}' describes a file, not a packed directory")
    with tempfile.TemporaryDirectory(prefix=".unpack.", dir=dest.parent if dest.parent.exists() else None) as tmp:
        joined = Path(tmp) / manifest["file"]
        join_parts(parts_dir, joined)
        with atomic_directory(dest) as build, tarfile.open(joined, mode="r:") as tar:
            seen = set()
            for member in tar:
                require(member.isfile() and re.fullmatch(r"[A-Za-z0-9._-]+", member.name) is not None
                        and member.name in contents, f"packed draft holds an unexpected entry '{member.name}'")
                data = tar.extractfile(member).read()
                expected = contents[member.name]
                require(len(data) == expected["size"] and hashlib.sha256(data).hexdigest() == expected["sha256"],
                        f"packed file {member.name}: sha256 mismatch with the manifest")
                (build / member.name).write_bytes(data)
                seen.add(member.name)
            missing = sorted(set(contents) - seen)
            require(not missing, f"packed draft lacks {', '.join(missing)}")
    return manifest


# ----------------------------------------------------------------------------- device calls
def tree_bytes(repo: str | Path) -> int:
    """Bytes of the tracked and the untracked-but-not-ignored files: what every device call sends."""
    total = 0
    for args in (["ls-files", "-z"], ["ls-files", "-z", "--others", "--exclude-standard"]):
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
        require(out.returncode == 0, f"'{repo}' is not a git checkout (git {' '.join(args)} failed)")
        for name in filter(None, out.stdout.split(b"\0")):
            path = Path(repo) / os.fsdecode(name)
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


@dataclass(frozen=True)
class DeviceCall:
    carry: tuple[str, ...]
    command: str
    timeout_s: int
    sends: int              # bytes of carried paths

    def as_dict(self) -> dict:
        return {"carry": list(self.carry), "command": self.command, "timeout_s": self.timeout_s,
                "carried_mib": round(self.sends / MiB, 2)}


def part_sizes(capacity: int, first_extra: int, cap: int) -> list[int]:
    """Part sizes (the last repeating) when each call carries `capacity` bytes and the first call
    also carries `first_extra` bytes of wheels: the first part is smaller so that it travels with
    them, unless that would leave it under 1 MiB (then the wheels travel alone). Parts <= `cap`;
    `SLACK` is left in every call for the manifest."""
    require(capacity >= 2 * MiB, f"a device call has only {capacity / MiB:.1f} MiB left for carried files "
                                 f"(the working tree takes the rest of {CALL_LIMIT // MiB} MiB); make the tree smaller")
    first, rest = min(cap, capacity - first_extra - SLACK), min(cap, capacity - SLACK)
    return [rest] if first < MiB or first == rest else [first, rest]


def plan_calls(parts_dir: str, manifest: dict, wheels_dir: str | None, wheel_bytes: int, capacity: int,
               minutes: int, prompts: tuple[str, int] | None = None) -> list[DeviceCall]:
    """Back-to-back device calls: the first carries the wheels (and the first part, if they fit
    together) and runs the CUDA smoke check, the middle ones carry a part each and check what has
    arrived, the last carries the last part and trains. Each call also carries the manifest.
    `prompts` (directory, bytes: the prompts the device answers before training) ride with the last
    part if they fit, else in a call of their own before it."""
    parts = [(f"{parts_dir}/{p['name']}", p["size"]) for p in manifest["parts"]]
    groups: list[list[tuple[str, int]]] = []
    if wheels_dir:
        groups.append([(wheels_dir, wheel_bytes)])
        if wheel_bytes + parts[0][1] + SLACK <= capacity:
            groups[0].append(parts.pop(0))
    groups += [[part] for part in parts]
    if prompts is not None:
        if sum(size for _, size in groups[-1]) + prompts[1] + SLACK <= capacity:
            groups[-1].append(prompts)
        else:
            groups.insert(len(groups) - 1, [prompts])
    calls = []
    for index, group in enumerate(groups):
        last = index == len(groups) - 1
        if last:
            command, timeout = f'bash scripts/gpu/train_on_gpu.sh "$OUT" {minutes}', 600
        elif index == 0:
            command, timeout = 'bash scripts/gpu/train_on_gpu.sh --smoke "$OUT"', 240
        else:
            command, timeout = "bash scripts/gpu/train_on_gpu.sh --check", 120
        carry = tuple(path for path, _ in group) + (f"{parts_dir}/{MANIFEST}",)
        calls.append(DeviceCall(carry, command, timeout, sum(size for _, size in group)))
    return calls


def plan_text(calls: list[DeviceCall], tree: int, capacity: int) -> str:
    lines = [f"Device calls: the working tree sends {tree / MiB:.1f} MiB, so each call carries at most "
             f"{capacity / MiB:.1f} MiB. Issue them back to back (the machine goes back 30 s after a call and "
             "the parts with it); re-run scripts/gpu/split_target.sh if the tree grows.", ""]
    for number, call in enumerate(calls, 1):
        lines.append(f"{number}. run(carry={json.dumps(list(call.carry))}, command={json.dumps(call.command)}, "
                     f"timeout_s={call.timeout_s})   # {call.sends / MiB:.1f} MiB carried")
    lines += ["", "Then, here: bash scripts/gpu/collect.sh FILES_AT runs/gpu-draft   (FILES_AT from the last reply)"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- wheels
def ensure_wheels(wheels_dir: Path, packages: dict[str, str]) -> list[Path]:
    """One wheel per package at the given version in `wheels_dir` (pip download, no dependencies);
    other versions' wheels of the same packages are removed (two versions stop the install)."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name, version in packages.items():
        stem = name.replace("-", "_")
        wanted = list(wheels_dir.glob(f"{stem}-{version}-*.whl"))
        for other in wheels_dir.glob(f"{stem}-*.whl"):
            if other not in wanted:
                other.unlink()
        if not wanted:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                   "-d", str(wheels_dir), f"{name}=={version}"], capture_output=True, text=True)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            require(done.returncode == 0, f"pip download {name}=={version} failed: {last}")
            wanted = list(wheels_dir.glob(f"{stem}-{version}-*.whl"))
            require(bool(wanted), f"pip download {name}=={version} left no wheel in '{wheels_dir}'")
        out += wanted
    return out


# ----------------------------------------------------------------------------- command line
def _split_target(args) -> int:
    from importlib.metadata import version

    repo = Path(args.repo).resolve()
    parts_dir = repo / args.parts
    if args.gguf:
        gguf = Path(args.gguf)
    else:
        from dflash2.targets.builtin import BUILTIN_TARGETS
        require(args.target in BUILTIN_TARGETS, f"--target '{args.target}' is not a built-in ({', '.join(BUILTIN_TARGETS)})")
        scratch = repo / ".gpu" / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        gguf = BUILTIN_TARGETS[args.target].locate_gguf(scratch)
    require(gguf.is_file(), f"GGUF '{gguf}' does not exist")
    wheels = [] if args.no_wheels else ensure_wheels(repo / args.wheels, {p: version(p) for p in ("gguf", "transformers")})
    wheel_bytes = sum(w.stat().st_size for w in wheels)
    tree = tree_bytes(repo)
    capacity = CALL_LIMIT - tree - int(args.margin_mb * MiB)
    cap = int(args.max_part_mb * 1_000_000)
    sizes = [int(args.part_mb * MiB)] if args.part_mb else part_sizes(capacity, wheel_bytes, cap)
    require(max(sizes) <= cap, f"--part-mb {args.part_mb} is above the {args.max_part_mb} MB part limit")
    require(max(sizes) <= capacity, f"--part-mb {args.part_mb}: a part would not fit one device call beside the "
                                    f"{tree / MiB:.1f} MiB tree (at most {capacity / MiB:.1f} MiB)")
    manifest = split_file(gguf, parts_dir, sizes)
    manifest["target"] = args.target
    _save_manifest(parts_dir, manifest)
    prompts_dir = repo / ".gpu" / "prompts"
    prompts = (".gpu/prompts", dir_bytes(prompts_dir)) if (prompts_dir / "prompts.json").is_file() else None
    calls = plan_calls(args.parts, manifest, args.wheels if wheels else None, wheel_bytes, capacity, args.minutes,
                       prompts)
    plan = {"tree_bytes": tree, "capacity_bytes": capacity, "gguf": str(gguf), "gguf_sha256": manifest["sha256"],
            "wheels": [w.name for w in wheels], "calls": [c.as_dict() for c in calls]}
    with atomic_write(repo / ".gpu" / "plan.json", "w") as handle:
        json.dump(plan, handle, indent=2)
    text = plan_text(calls, tree, capacity)
    (repo / ".gpu" / "plan.md").write_text(text + "\n")
    print(f"{gguf.name}: {manifest['size']} bytes in {len(manifest['parts'])} parts under {args.parts} "
          f"(sha256 {manifest['sha256'][:16]}...); wheels: {', '.join(w.name for w in wheels) or 'none'}")
    print(text)
    return 0


def _collect(args) -> int:
    from dflash2.files.atomic import refuse_existing_output
    from dflash2.model.draft import DFlash2DraftModel

    dest = Path(args.dest)
    refuse_existing_output(dest, args.force, "DEST", "--force", "the draft's files")
    manifest = unpack_parts(args.parts_dir, dest)
    draft = DFlash2DraftModel.from_pretrained(dest)
    summary = Path(args.parts_dir) / "summary.json"
    print(json.dumps({"draft": str(dest), "files": [c["name"] for c in manifest["contents"]],
                      "parameters": sum(p.numel() for p in draft.parameters()),
                      "num_layers": draft.config.num_hidden_layers, "block_size": draft.config.block_size,
                      "summary": str(summary) if summary.is_file() else None}))
    return 0


def _main(argv: list[str] | None) -> int:
    parser = OneLineParser(prog="python -m dflash2.tools.gpu.parts", description=first_paragraph(__doc__))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    split = sub.add_parser("split-target", help="split a target's GGUF into parts for device calls; print the calls")
    split.add_argument("--target", default="smollm2", help="built-in target whose GGUF to split (and convert there)")
    split.add_argument("--gguf", help="split this GGUF instead of the built-in's")
    split.add_argument("--repo", default=".", help="repository root (default: .)")
    split.add_argument("--parts", default=".gpu/parts", help="parts directory, relative to the repository root")
    split.add_argument("--wheels", default=".gpu/wheels", help="wheels directory, relative to the repository root")
    split.add_argument("--no-wheels", action="store_true", help="carry no wheels (the device has gguf and transformers)")
    split.add_argument("--part-mb", type=float, help="part size in MiB (default: what fits one call beside the tree)")
    split.add_argument("--max-part-mb", type=float, default=60.0, help="largest part, in MB (default 60)")
    split.add_argument("--margin-mb", type=float, default=1.0, help="room left in each call for the tree to grow (MiB)")
    split.add_argument("--minutes", type=int, default=8, help="the training call's wall-clock budget in the plan")
    status = sub.add_parser("status", help="which parts are present and verified (one line)")
    status.add_argument("parts_dir", nargs="?", default=".gpu/parts")
    join = sub.add_parser("join", help="verify the parts and join them into one file")
    join.add_argument("parts_dir")
    join.add_argument("dest")
    collect = sub.add_parser("collect", help="join a draft's parts into a directory and load it")
    collect.add_argument("parts_dir")
    collect.add_argument("dest")
    collect.add_argument("--force", action="store_true", help="replace the draft's files in an existing DEST")
    args = parser.parse_args(argv)
    if args.command == "split-target":
        return _split_target(args)
    if args.command == "status":
        state = parts_status(args.parts_dir)
        print(state.line())
        return 0 if not state.bad else 1
    if args.command == "join":
        manifest = join_parts(args.parts_dir, args.dest)
        print(f"{args.dest}: {manifest['size']} bytes, sha256 {manifest['sha256']} verified")
        return 0
    return _collect(args)


main = partial(run_command, _main)   # a bad input is one line `error: ...` and 2 (`argparsing.run_command`)


if __name__ == "__main__":
    sys.exit(main())
