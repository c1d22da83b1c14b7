"""Measure what `speculation_advice` needs for llama.cpp on this machine, for one draft and target.

Contract: `measure(lc, target_gguf, draft_gguf, expected, prompts, settings)` -> `Measurements`:
- C(w) = T(w) / T(1) for w = 1..K+1: `llama_cpp.verify_costs` (llama-bench, the median of
  `settings.repetitions` samples, after `settings.depth` tokens of context);
- D(k): `grid` runs `llama-speculative-simple` on `prompts` (`settings.new_tokens` tokens),
  plain (`--spec-type none`) and with the draft at `--spec-draft-n-max k` (`setting_runs`; the
  n-gram modes too where asked), interleaved, `settings.runs` rounds (medians): a round's time per
  target pass (passes = n_predict - n_accept: each pass commits its accepted drafts + 1) over the
  plain run's, less C(k + 1) (`measurements_from`). The unit is the plain run's step, not
  llama-bench's T(1): llama-bench times another code path at another context and read 1.5x the
  runs' step for a Q4_1 target, which hid the draft's own cost. S is therefore 0 (the plain step is
  the unit). The same runs give the measured speedup (tokens/s over plain);
- E(k): `expected` (dflash2's own measurement of the draft, `acceptance_cost.expected_tokens_by_width`).
`advice_for(...)` / `advice_for_export(...)` run the whole thing for `dflash2 export --to gguf` and
return the printed lines.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from dflash2.export import llama_cpp
from dflash2.export.speculation_advice import Measurements, advise


@dataclass(frozen=True)
class AdviceSettings:
    max_drafts: int = 7          # K: n-max 1..K (the draft's block size - 1)
    new_tokens: int = 64
    runs: int = 3                # rounds of speculative-simple runs per setting (medians)
    repetitions: int = 10        # llama-bench samples per width
    depth: int = 256             # context before a timed verify pass
    threads: int = 1


@dataclass(frozen=True)
class Timing:
    """One setting of llama-speculative-simple over the prompts, `rounds` times (medians over rounds)."""
    tokens_per_second: float     # a round's new tokens / its decode seconds, median
    seconds_per_pass: float      # a round's decode seconds / its target passes, median
    tokens_per_pass: float       # new tokens / target passes (tau of the whole run, plain steps included)
    accepted: int                # drafted tokens accepted, first round
    drafted: int


def setting_runs(base: llama_cpp.Run, draft: Path | None, max_drafts: int, ngram_modes=()) -> dict[str, llama_cpp.Run]:
    """plain, the draft at n-max 1..K, and llama.cpp's n-gram modes (n-max K), by label."""
    runs = {"plain": replace(base, spec_type="none")}
    if draft is not None:
        runs.update({f"draft n-max {k}": replace(base, draft=draft, n_max=k) for k in range(1, max_drafts + 1)})
    runs.update({mode: replace(base, spec_type=mode, n_max=max_drafts) for mode in ngram_modes})
    return runs


def grid(lc: llama_cpp.LlamaCpp, runs: dict[str, llama_cpp.Run], prompts: list[str], rounds: int) -> dict[str, Timing]:
    """Every setting on every prompt, interleaved (round 1: each setting once per prompt; round 2: ...)."""
    per_round: dict[str, list[list[llama_cpp.SpecRun]]] = {label: [] for label in runs}
    for _ in range(rounds):
        for label, run in runs.items():
            per_round[label].append([llama_cpp.speculative(lc, replace(run, prompt=p)) for p in prompts])
    out = {}
    for label, rounds_ in per_round.items():
        tokens = [sum(r.n_predict for r in rs) for rs in rounds_]
        seconds = [sum(r.decode_seconds for r in rs) for rs in rounds_]
        passes = [sum(r.passes for r in rs) for rs in rounds_]
        out[label] = Timing(statistics.median(t / s for t, s in zip(tokens, seconds)),
                            statistics.median(s / n for s, n in zip(seconds, passes)),
                            tokens[0] / passes[0], sum(r.n_accept for r in rounds_[0]),
                            sum(r.n_drafted for r in rounds_[0]))
    return out


def measurements_from(seconds: dict[int, float], timings: dict[str, Timing], expected: dict[int, float],
                      where: str) -> Measurements:
    """C(w) (the shape of llama-bench's `seconds` per width), D(k) in plain steps of the runs and the
    measured speedups, from `timings`."""
    curve, plain = {w: t / seconds[1] for w, t in seconds.items()}, timings["plain"]
    ks = [k for k in sorted(expected) if f"draft n-max {k}" in timings]
    draft_cost = {k: max(timings[f"draft n-max {k}"].seconds_per_pass / plain.seconds_per_pass - curve[k + 1], 0.0)
                  for k in ks}
    measured = {k: timings[f"draft n-max {k}"].tokens_per_second / plain.tokens_per_second for k in ks}
    return Measurements(curve, draft_cost, {k: expected[k] for k in ks}, 0.0, measured, where)


def measure(lc: llama_cpp.LlamaCpp, target_gguf: Path, draft_gguf: Path, expected: dict[int, float],
            prompts: list[str], settings: AdviceSettings = AdviceSettings()) -> Measurements:
    seconds = llama_cpp.verify_costs(lc, target_gguf, range(1, settings.max_drafts + 2), settings.depth,
                                     settings.repetitions, settings.threads)
    base = llama_cpp.Run(target_gguf, "", settings.new_tokens, threads=settings.threads)
    timings = grid(lc, setting_runs(base, draft_gguf, settings.max_drafts), prompts, settings.runs)
    return measurements_from(seconds, timings, expected,
                             f"llama.cpp in {lc.bin_dir}, target {target_gguf.name}, {settings.threads} threads")


def advice_for(lc: llama_cpp.LlamaCpp, target_gguf: Path, draft_gguf: Path, expected: dict[int, float],
               prompts: list[str], settings: AdviceSettings = AdviceSettings()) -> list[str]:
    return advise(measure(lc, target_gguf, draft_gguf, expected, prompts, settings)).lines()


def dflash2_target(target: str) -> str:
    """The Hugging Face target dflash2 measures E(k) on: a built-in name as it is, a target's .gguf
    converted once into the cache (float32, `targets.builtin.convert_gguf`)."""
    from dflash2.files.cache import cache_dir
    from dflash2.files.atomic import sha256_file
    from dflash2.targets.builtin import BUILTIN_TARGETS, convert_gguf

    if target in BUILTIN_TARGETS or not target.endswith(".gguf"):
        return target
    path = Path(target)
    return str(convert_gguf(path, cache_dir() / "targets" / f"{path.stem}-{sha256_file(path)[:12]}"))


def advice_for_export(lc: llama_cpp.LlamaCpp, target: str, draft_dir: Path, draft_gguf: Path,
                      prompts: int, new_tokens: int, threads: int = 1) -> list[str]:
    """`dflash2 export --to gguf`'s advice: E(k) from dflash2 (target and draft in float32, `prompts`
    benchmark prompts x `new_tokens`), the costs from llama.cpp on the target's GGUF."""
    from dflash2.export.acceptance_cost import expected_tokens_by_width, measurement_prompts
    from dflash2.export.gguf_vocab import target_gguf
    from dflash2.pipeline import load_decoder

    pipe = load_decoder(dflash2_target(target), str(draft_dir), dtype="float32", draft_dtype="float32",
                        proposer="draft")
    settings = AdviceSettings(max_drafts=pipe.decoder.draft.config.block_size - 1, new_tokens=new_tokens,
                              threads=threads)
    ids = measurement_prompts(pipe.tokenizer, max(prompts, 1))
    expected = expected_tokens_by_width(pipe.decoder.target, pipe.decoder.draft, ids, new_tokens, pipe.stop_token_ids,
                                        range(1, settings.max_drafts + 1))
    with target_gguf(target) as gguf:
        return advice_for(lc, gguf, draft_gguf, expected, [pipe.tokenizer.decode(ids[0])], settings)
