"""The typed runs of `dflash2 bench` and what is reported of them.

Contract:
- `Side`: one decoder's runs over a list of prompts at one batch size: per-row outputs and
  `RowStats`, and per batch (one `generate` call) its `BatchTiming`, wall seconds and new tokens.
  `PairRuns`: one proposer's and the autoregressive decoder's sides at one concurrency, one `Side`
  per conversation turn (`ar` empty without a baseline). `DatasetRun`: one dataset at every
  concurrency for every proposer (the autoregressive sides decoded once, shared), with what the
  peers need. Each has `to_dict` / `from_dict` (the saved parts of `--resume`).
- `summarize(sides, block)` -> the pooled figures of one decoder's sides; `entry(pair, block,
  greedy)` -> the report of one dataset (or all) at one concurrency: the speculative summary,
  speedup pooled, as the median of paired batch ratios (`median_pair_ratio`, wall and CPU time),
  mismatches; `speculation_overhead` what the drafted cycles cost on the speculative decoder's own
  clock. `DEFINITIONS` says what each reported key means (saved with the results).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from dflash2.decoding.loop.stats import BatchTiming, RowStats

DEFINITIONS = {
    "acceptance_length": "committed tokens / verification passes, bonus token counted, prefill token excluded; "
                         "pooled over all cycles (total tokens / total cycles), not a mean of per-prompt means",
    "tokens_per_second": "new tokens / wall seconds of the generate() calls, prefill included",
    "time_per_output_token_ms": "(wall - prefill) / new tokens",
    "speedup": "autoregressive time per output token / speculative time per output token, same engine, "
               "same prompts, same batch size",
    "mismatches": "sequences whose speculative output differs from the autoregressive output (T=0 only)",
    "position_acceptance": "fraction of cycles in which drafts 1..k were all accepted",
    "drafts_verified_per_cycle": "draft tokens the target verified per speculative cycle (the adaptive length)",
    "plain_steps": "one-token target steps without a draft pass (fallback when drafting does not pay)",
    "fallback_seconds": "wall time of the batches' plain steps",
    "speculation_overhead": "(wall time of the speculative cycles - the tokens they committed x the time per token of "
                            "the same batches' plain steps) / decoding time: what speculating cost (negative: what it "
                            "saved), from the speculative decoder's own clock, without the other decoder's noise",
    "speedup_median": "median over batch pairs (each batch decoded by both decoders in turn, --repeats times) of "
                      "autoregressive / speculative time per output token of the pair: robust to a noisy host",
    "speedup_cpu_median": "the same median with each batch's process CPU seconds of its decoding cycles (all threads, "
                          "prefill excluded) in place of wall time: what the hypervisor steals from a shared host "
                          "does not count",
}


@dataclass
class Side:
    """One decoder's runs over a list of prompts at one batch size: per-row counts and outputs,
    and the batches' timing (each `generate` call is one batch)."""
    outputs: list[list[int]] = field(default_factory=list)
    stats: list[RowStats] = field(default_factory=list)
    batches: list[BatchTiming] = field(default_factory=list)
    seconds: float = 0.0
    batch_seconds: list[float] = field(default_factory=list)   # wall seconds of each generate() call
    batch_tokens: list[int] = field(default_factory=list)      # new tokens of each generate() call

    def add(self, results, seconds: float) -> None:
        self.outputs += [r.tokens for r in results]
        self.stats += [r.stats for r in results]
        self.batches.append(results[0].timing)  # every row of a generate() call carries its batch's timing
        self.seconds += seconds
        self.batch_seconds.append(seconds)
        self.batch_tokens.append(sum(r.stats.new_tokens for r in results))

    def batch_tpots(self, cpu: bool = False) -> list[float]:
        """Each batch's (wall - prefill) seconds per new token; with `cpu`, its cycles' process CPU
        seconds per new token."""
        return [(timing.cycle_cpu_seconds if cpu else seconds - timing.prefill_seconds) / max(tokens, 1)
                for timing, seconds, tokens in zip(self.batches, self.batch_seconds, self.batch_tokens)]

    @property
    def prefill(self) -> float:
        return sum(t.prefill_seconds for t in self.batches)

    @property
    def phases(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for timing in self.batches:
            for phase, value in timing.phase_seconds.items():
                out[phase] = out.get(phase, 0.0) + value
        return out

    def to_dict(self) -> dict:
        return {"outputs": self.outputs, "stats": [st.to_dict() for st in self.stats],
                "batches": [t.to_dict() for t in self.batches], "seconds": self.seconds,
                "batch_seconds": self.batch_seconds, "batch_tokens": self.batch_tokens}

    @classmethod
    def from_dict(cls, data: dict) -> "Side":
        return cls(data["outputs"], [RowStats.from_dict(st) for st in data["stats"]],
                   [BatchTiming.from_dict(t) for t in data["batches"]], data["seconds"], data["batch_seconds"],
                   data["batch_tokens"])


@dataclass
class PairRuns:
    """One proposer's and the autoregressive decoder's runs at one concurrency: one `Side` per conversation
    turn (`ar` empty without a baseline)."""
    ar: list[Side] = field(default_factory=list)
    spec: list[Side] = field(default_factory=list)

    def extend(self, other: "PairRuns") -> None:
        self.ar += other.ar
        self.spec += other.spec


@dataclass
class DatasetRun:
    """One dataset at every concurrency for every proposer, with what the peers need: `runs[proposer][c]`
    pairs that proposer's sides with the autoregressive ones (one list of `ar` sides per concurrency,
    shared by every proposer: they were decoded once, beside all of them), the prompts in run order,
    the answers at the first concurrency (autoregressive, or the first proposer's without a baseline)
    and each proposer's per-cycle acceptance lengths there."""
    runs: dict[str, dict[int, PairRuns]]
    prompts: list[list[int]]
    outputs: list[list[int]]
    cycles: dict[str, list[list[int]]]

    def to_dict(self) -> dict:
        first = next(iter(self.runs.values()))
        return {"ar": {str(c): [side.to_dict() for side in pair.ar] for c, pair in first.items()},
                "spec": {proposer: {str(c): [side.to_dict() for side in pair.spec] for c, pair in by_c.items()}
                         for proposer, by_c in self.runs.items()},
                "prompts": self.prompts, "outputs": self.outputs, "cycles": self.cycles}

    @classmethod
    def from_dict(cls, data: dict) -> "DatasetRun":
        ar = {int(c): [Side.from_dict(x) for x in sides] for c, sides in data["ar"].items()}
        runs = {proposer: {int(c): PairRuns(ar[int(c)], [Side.from_dict(x) for x in sides]) for c, sides in by_c.items()}
                for proposer, by_c in data["spec"].items()}
        return cls(runs, data["prompts"], data["outputs"], data["cycles"])


def summarize(sides: list[Side], block: int) -> dict:
    stats = [s for side in sides for s in side.stats]
    batches = [t for side in sides for t in side.batches]
    cycles = sum(s.cycles for s in stats)
    committed = sum(sum(s.committed_per_cycle) for s in stats)
    tokens = sum(s.new_tokens for s in stats)
    seconds, prefill = sum(x.seconds for x in sides), sum(x.prefill for x in sides)
    phases: dict[str, float] = {}
    for side in sides:
        for phase, value in side.phases.items():
            phases[phase] = phases.get(phase, 0.0) + value
    verified = sum(sum(s.drafts_per_cycle) for s in stats)
    lengths: dict[int, int] = {}
    for s in stats:
        for k in s.drafts_per_cycle:
            lengths[k] = lengths.get(k, 0) + 1
    return {
        "acceptance_length": committed / cycles if cycles else None, "cycles": cycles, "new_tokens": tokens,
        "sequences": len(stats), "seconds": seconds, "prefill_seconds": prefill,
        "tokens_per_second": tokens / seconds if seconds else None,
        "time_per_output_token_ms": 1000 * (seconds - prefill) / tokens if tokens else None,
        "position_acceptance": [sum(s.accepted_at_position[k] for s in stats) / cycles if cycles else 0.0
                                for k in range(block - 1)],
        "histogram": {tau: sum(s.committed_per_cycle.count(tau) for s in stats) for tau in range(1, block + 1)},
        "drafts_verified_per_cycle": verified / cycles if cycles else None,
        "draft_lengths": dict(sorted(lengths.items())),
        "plain_steps": sum(s.plain_steps for s in stats),
        "cycles_by_source": _by_source(s.cycles_by_source for s in stats),
        "accepted_by_source": _by_source(s.accepted_by_source for s in stats),
        "tree_cycles": sum(s.tree_cycles for s in stats), "tree_extra_tokens": sum(s.tree_extra_tokens for s in stats),
        "fallback_seconds": sum(t.plain_seconds for t in batches),
        "speculation_overhead": speculation_overhead(stats, batches),
        "phase_seconds": phases,
    }


def _by_source(counts) -> dict[str, int]:
    """Per-source counts summed over rows."""
    total: dict[str, int] = {}
    for row in counts:
        for source, n in row.items():
            total[source] = total.get(source, 0) + n
    return total


def speculation_overhead(stats: list[RowStats], batches: list[BatchTiming]) -> float | None:
    """What the cycles that ran the draft cost beyond plain steps committing the same tokens, as a
    share of the decoding time, from one decoder's own clock: (time in cycles with a draft pass -
    their tokens x the time per token of the same batches' plain steps) / decoding time. Negative
    when speculation paid; None without both kinds of step (`always`, `never`)."""
    plain_tokens = sum(t.plain_tokens for t in batches)
    plain_seconds = sum(t.plain_seconds for t in batches)
    decoding = sum(t.total_seconds - t.prefill_seconds for t in batches)
    drafted_tokens = sum(max(s.new_tokens - 1, 0) for s in stats) - plain_tokens   # the prefill's token excluded
    if not plain_tokens or drafted_tokens <= 0 or decoding <= 0:
        return None
    return (decoding - plain_seconds - drafted_tokens * plain_seconds / plain_tokens) / decoding


def entry(pair: PairRuns, block: int, greedy: bool) -> dict:
    """The report of one dataset (or all) at one concurrency: the speculative summary, speedup, mismatches."""
    ar_sides, spec_sides = pair.ar, pair.spec
    spec, ar = summarize(spec_sides, block), summarize(ar_sides, 1)
    if not ar["sequences"]:  # --no-baseline
        ar["time_per_output_token_ms"] = None
        greedy = False
    pairs = [(a, s) for ar_side, spec_side in zip(ar_sides, spec_sides)
             for a, s in zip(ar_side.outputs, spec_side.outputs)]
    out = dict(spec)
    out.update(speedup=(ar["time_per_output_token_ms"] / spec["time_per_output_token_ms"]
                        if spec["time_per_output_token_ms"] and ar["time_per_output_token_ms"] else None),
               baseline_tokens_per_second=ar["tokens_per_second"],
               baseline_time_per_output_token_ms=ar["time_per_output_token_ms"],
               baseline_seconds=ar["seconds"],
               mismatches=sum(a != s for a, s in pairs) if greedy else None, compared=len(pairs),
               speedup_median=median_pair_ratio(ar_sides, spec_sides),
               speedup_cpu_median=median_pair_ratio(ar_sides, spec_sides, cpu=True))
    return out


def median_pair_ratio(ar_sides: list[Side], spec_sides: list[Side], cpu: bool = False) -> float | None:
    """The median over batch pairs of autoregressive / speculative time (with `cpu`: process CPU
    time of the cycles) per output token; None without a baseline."""
    ratios = [a / s for ar_side, spec_side in zip(ar_sides, spec_sides)
              for a, s in zip(ar_side.batch_tpots(cpu), spec_side.batch_tpots(cpu)) if s > 0]
    return statistics.median(ratios) if ratios else None
