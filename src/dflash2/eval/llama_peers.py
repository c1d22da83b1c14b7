"""llama.cpp as peers of `dflash2 bench --peers`: its plain decoding and its DFlash2 speculation,
on the bench's own prompts, at the bench's precision.

Contract: `llama_peers(job: LlamaJob)` -> {report key: peer report of `dflash2.eval.peers`} for
the peers of `LLAMA_PEERS` that `job.wanted` names; it never raises (status ok / unavailable /
failed, with the reason); `stored(store, job)` is it resumable (a bench part); `threads(...)` the
first thread count given, else torch's. Both run `llama-speculative-simple` (`export.llama_cpp.speculative`,
weights not repacked unless $DFLASH2_LLAMA_CPP_REPACK=1) greedy, batch 1, `job.threads` threads:

- `llama-cpp` (key `llama_cpp`): the target alone, plain decoding (the program's loop with an
  n-gram source allowed 0 drafts: it refuses `--spec-type none`);
- `llama-cpp-dflash` (key `llama_cpp_dflash`): with the draft exported to GGUF at the same
  precision (`dflash2 export --to gguf`), `--spec-type draft-dflash --spec-draft-n-max B-1`.

The target's GGUF is the unquantized one at the bench's precision (`GGUF_TYPES`: f32 for
float32, bf16 for bfloat16; `export.gguf_target.unquantized_gguf` of the built-in target's own
GGUF, whose float32 dequantisation is exactly the weights dflash2 runs), written once into
`job.scratch`. Unavailable: llama.cpp not found (`export.llama_cpp.INSTALL_HINT`), T > 0 (greedy
only, like the engine peers), another precision, a tiny or non-built-in target (no GGUF). When
both run, they decode each prompt in turn (which goes first alternates).

Each prompt is the decoded text of the bench's token ids (llama.cpp takes text; a prompt it
tokenizes otherwise is noted), asked for `max_new_tokens` (`-n` one less: the program stops
once it has more than `-n`; with the draft, after the cycle that gets there). Per report, SUMMARY as `peers.summarize` makes it: new tokens =
llama.cpp's n_predict, seconds = its prompt + decode time (no model load), `mismatches` = outputs
whose text is not dflash2's plain decoding's (`acceptance.same_text`: llama.cpp prints text), tau
of `llama-cpp-dflash` = tokens / target passes after the prompt (llama.cpp's first pass, from the
prompt's last token, commits the first token and counts, as for prompt lookup), and its speedup
over `llama-cpp` when both ran. Reports carry `name` (e.g. "llama.cpp plain (bf16 GGUF)"), the
`threads`, `gguf_type`, `dtype`, llama.cpp's version and one command line.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash2.errors import DFlash2Error
from dflash2.eval.acceptance import same_text
from dflash2.eval.acceptance_arms import LLAMA_TYPES
from dflash2.eval.engine_peers import exported_draft
from dflash2.eval.peers import _report, summarize
from dflash2.export import llama_cpp
from dflash2.export.gguf_target import unquantized_gguf
from dflash2.targets.builtin import BUILTIN_TARGETS, SOURCE_RECORD

GGUF_TYPES = {dtype: kind for kind, dtype in LLAMA_TYPES.items() if dtype}   # precision -> target GGUF type


@dataclass(frozen=True)
class LlamaPeer:
    key: str            # report key in results.json
    short: str          # name in --peers
    speculative: bool   # with the draft's GGUF export
    label: str          # results.md's name, before the GGUF type


LLAMA_PEERS = (LlamaPeer("llama_cpp", "llama-cpp", False, "llama.cpp plain"),
               LlamaPeer("llama_cpp_dflash", "llama-cpp-dflash", True, "llama.cpp + DFlash2 draft"))
LLAMA_PEER_NAMES = tuple(p.short for p in LLAMA_PEERS)


@dataclass(frozen=True)
class LlamaJob:
    wanted: frozenset[str]                  # --peers names (others ignored)
    target: str                             # the bench's --target: a built-in name or a directory
    tiny: bool
    draft: str | None                       # the draft checkpoint directory (llama-cpp-dflash)
    precision: str                          # the bench's: float32 | bfloat16 | float16
    threads: int
    block_size: int
    prompts: dict[str, list[list[int]]]     # dataset -> token ids
    ar_outputs: dict[str, list[list[int]]] | None   # dflash2's plain decoding (T=0)
    tokenizer: object
    config: object                          # GenerationConfig
    scratch: Path                           # GGUFs of the target and the draft
    llama_cpp: str | None = None            # llama.cpp's directory (default: `find_llama_cpp`'s search)


def threads(*choices: int | None) -> int:
    """The first thread count given (--llama-threads, --threads), else torch's."""
    return next((n for n in choices if n), None) or torch.get_num_threads()


def stored(store, job: LlamaJob) -> dict[str, dict]:
    """`llama_peers(job)`, or its part saved by an interrupted run (`eval.parts.PartStore`; its
    thread count in the part's name); saved when every peer ran."""
    part = f"peers-llama-cpp-t{job.threads}"
    group = store.load(part)
    if group is None:
        print(f"# peers: llama.cpp ({job.threads} thread{'s' if job.threads != 1 else ''}, batch 1)", file=sys.stderr)
        group = llama_peers(job)
        if all(r["status"] == "ok" for r in group.values()):
            store.save(part, group)
    for report in group.values():
        if report["status"] == "ok":
            o = report["overall"]
            tau = f", tau {o['acceptance_length']:.2f}" if o["acceptance_length"] != 1.0 else ""
            print(f"# peers: {report['name']}: {o['tokens_per_second']:.1f} tok/s{tau}, mismatches {o.get('mismatches')}",
                  file=sys.stderr)
    return group


def source_gguf(target: str, scratch: Path) -> Path | None:
    """The built-in target's own GGUF, for its name or its converted directory; None for others."""
    name = target if target in BUILTIN_TARGETS else None
    record = Path(target) / SOURCE_RECORD
    if name is None and record.is_file():
        named = json.loads(record.read_text()).get("target")
        name = named if named in BUILTIN_TARGETS else None
    return None if name is None else BUILTIN_TARGETS[name].locate_gguf(scratch)


def _why_unavailable(job: LlamaJob) -> str | None:
    if job.config.temperature > 0:
        return "llama.cpp peers run greedy only (T=0)"
    if job.precision not in GGUF_TYPES:
        return f"no unquantized GGUF at {job.precision}: llama.cpp peers run at {' or '.join(GGUF_TYPES)}"
    if job.tiny:
        return "a tiny random target has no GGUF"
    return None


def llama_peers(job: LlamaJob) -> dict[str, dict]:
    peers = [p for p in LLAMA_PEERS if p.short in job.wanted]
    kind = GGUF_TYPES.get(job.precision)
    shown = kind or job.precision
    extra = {"threads": job.threads, "gguf_type": kind, "dtype": job.precision}
    base = {p.key: _report("unavailable", _description(p, job, shown), name=f"{p.label} ({shown} GGUF)", **extra)
            for p in peers}

    def every(status: str, reason: str) -> dict[str, dict]:
        return {key: dict(report, status=status, reason=reason) for key, report in base.items()}
    try:
        lc = llama_cpp.find_llama_cpp(job.llama_cpp)
    except DFlash2Error as err:
        return every("unavailable", str(err))
    reason = llama_cpp.INSTALL_HINT if lc is None else _why_unavailable(job)
    if reason:
        return every("unavailable", reason)
    try:
        source = source_gguf(job.target, job.scratch)
        if source is None:
            return every("unavailable", f"target '{job.target}' has no GGUF: llama.cpp peers need a built-in target "
                                        f"({', '.join(BUILTIN_TARGETS)}), whose GGUF ships with it")
        target = job.scratch / f"{source.stem}.{kind}.gguf"
        if not target.is_file():
            unquantized_gguf(source, target, job.precision)
        draft = None
        if any(p.speculative for p in peers):
            draft = exported_draft(job.draft, "gguf", job.scratch, job.precision, target=str(source)) / "draft.gguf"
        runs, commands, notes = _decode(lc, job, peers, target, draft)
        version = lc.version().removeprefix("version: ")
    except Exception as err:   # a peer's failure is reported, not fatal
        return every("failed", " ".join(f"{type(err).__name__}: {err}".split())[:600])
    reports = {}
    for peer in peers:
        report = dict(base[peer.key], status="ok", versions={"llama.cpp": version},
                      description=_description(peer, job, shown, version), notes=list(notes))
        _summaries(report, runs[peer.key], peer.speculative, runs.get("llama_cpp"), job)
        report["command"] = commands[peer.key]
        reports[peer.key] = report
    return reports


def _description(peer: LlamaPeer, job: LlamaJob, kind: str, version: str = "") -> str:
    what = (f"with the draft's GGUF export ({job.precision}), --spec-type draft-dflash, "
            f"--spec-draft-n-max {job.block_size - 1}" if peer.speculative else "the target alone, plain decoding")
    return (f"llama.cpp{f' ({version})' if version else ''} llama-speculative-simple, target {kind} GGUF, {what}, "
            f"{job.threads} thread{'s' if job.threads != 1 else ''}, batch 1, greedy")


def _decode(lc, job: LlamaJob, peers: list[LlamaPeer], target: Path, draft: Path | None):
    """Every prompt by every peer, in turn -> ({key: {dataset: [row]}}, {key: a command line}, notes)."""
    runs: dict[str, dict] = {p.key: {name: [] for name in job.prompts} for p in peers}
    commands, notes, turn = {}, [], 0
    for name, prompts in job.prompts.items():
        for index, ids in enumerate(prompts):
            text = job.tokenizer.decode(ids)
            if llama_cpp.tokenize(lc, target, text) != list(ids):
                notes.append(f"{name} prompt {index}: llama.cpp tokenizes it otherwise than dflash2")
            reference = job.ar_outputs[name][index] if job.ar_outputs else None
            for peer in (peers if turn % 2 == 0 else peers[::-1]):   # -n N: it stops once it has more than N tokens
                run = llama_cpp.speculative(lc, llama_cpp.Run(
                    target, text, max(job.config.max_new_tokens - 1, 1), draft if peer.speculative else None,
                    "draft-dflash" if peer.speculative else "none", job.block_size - 1, threads=job.threads))
                runs[peer.key][name].append({
                    "new_tokens": run.n_predict, "seconds": run.encode_seconds + run.decode_seconds,
                    "passes": run.passes if peer.speculative else None,
                    "same": None if reference is None else same_text(run.text, reference, job.tokenizer)})
                shown = list(run.command)
                shown[shown.index("-p") + 1] = "PROMPT"
                commands.setdefault(peer.key, " ".join(shown))
            turn += 1
    return runs, commands, notes


def _summaries(report: dict, runs: dict, speculative: bool, plain: dict | None, job: LlamaJob) -> None:
    """Per dataset and overall: `summarize`, its mismatches counted on text, tau 1 for plain decoding;
    `plain` (llama.cpp plain's rows, when it ran) is a speculative peer's baseline."""
    plain = plain if speculative else None

    def summary(rows: list[dict], base: dict | None) -> dict:
        out = summarize(rows, None, base["time_per_output_token_ms"] if base else None)
        if job.ar_outputs is not None:
            out["mismatches"] = sum(not r["same"] for r in rows)
        if not speculative:
            out["acceptance_length"] = 1.0
        return out
    everything, plain_all = [], []
    for name in job.prompts:
        base = summarize(plain[name], None) if plain else None
        report["datasets"][name] = summary(runs[name], base)
        everything += runs[name]
        plain_all += plain[name] if plain else []
    report["overall"] = summary(everything, summarize(plain_all, None) if plain else None)
    report["notes"].append("mismatches: outputs whose text is not dflash2's plain decoding's at the same precision "
                           "(llama.cpp prints text); seconds = llama.cpp's prompt + decode time, no model load")
    if speculative:
        report["notes"].append("acceptance length = tokens / target passes after the prompt (llama.cpp's first pass "
                               "commits the first token and counts)" + ("; speedup is over llama.cpp plain, same "
                                                                         "prompts" if plain else ""))
    else:
        report["notes"].append("acceptance length of an autoregressive decoder is 1 by definition")
