"""What decoding reports: per-row counts, kept apart from the batch's timing.

Contract:
- `RowStats` holds one sequence's counts only (no clock): its speculative cycles (target passes
  that verified at least one draft token), the tokens each of them committed, how many drafts
  each verified (the length the policy chose), per-position acceptance, and the number of plain
  one-token target steps (fallback, `--speculate never`, or a length of 0). Counts follow what
  was committed: a cycle cut short by a stop token or `max_new_tokens` counts the tokens and
  accepted positions it committed, in the histogram and in the per-position figures alike.
- `acceptance_length` = tokens committed by speculative cycles / speculative cycles (bonus
  counted, at most the block size); `tokens_per_pass` = new tokens after the prefill's / all
  target passes (speculative cycles and plain steps). Per source ("draft", "lookup"): the cycles
  that verified a row's tokens from it and the tokens of it the target accepted
  (`cycles_by_source`, `accepted_by_source`); cycles that verified both as a tree (`tree_cycles`,
  counted under the winning branch's source) and the tree's cost, its nodes beyond the longer
  branch (`tree_extra_tokens`).
- `BatchTiming` holds the clock of one decoded batch: prefill, total wall time, per-phase time
  (prefill, draft, selector, verify, accept), the plain steps taken in fallback with their
  time and tokens, and the process CPU time of the cycles (every thread's, prefill excluded; on a
  shared host it does not grow with the time the hypervisor steals, as wall time does). A finished
  row carries the timing of its batch up to that moment.
- `Commit` is what one cycle adds to a row: its tokens, how many of them (the leading ones)
  were proposed tokens accepted by the target (the rest is the target's own token), how many
  proposed tokens the cycle verified for the row (0: a plain step, counted in
  `RowStats.plain_steps`) and where they came from (`source`: "draft", "lookup", "" for none;
  for a tree the winning branch's, with `tree_extra` its nodes beyond the longer branch).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RowStats:
    block_size: int
    cycles: int = 0                                                     # speculative cycles
    committed_per_cycle: list[int] = field(default_factory=list)        # tokens per speculative cycle
    drafts_per_cycle: list[int] = field(default_factory=list)           # draft tokens verified per cycle
    accepted_at_position: list[int] = field(default_factory=list)       # cycles whose drafts 1..k were accepted
    plain_steps: int = 0                                                # one-token target passes
    new_tokens: int = 0
    cycles_by_source: dict[str, int] = field(default_factory=dict)      # source -> cycles verifying its tokens
    accepted_by_source: dict[str, int] = field(default_factory=dict)    # source -> its tokens accepted
    tree_cycles: int = 0                                                # cycles verifying draft and lookup as a tree
    tree_extra_tokens: int = 0                                          # their nodes beyond the longer branch

    def __post_init__(self) -> None:
        if not self.accepted_at_position:
            self.accepted_at_position = [0] * max(self.block_size - 1, 0)

    def record_cycle(self, verified: int, committed: int, accepted: int, source: str = "draft",
                     tree_extra: int | None = None) -> None:
        """One target pass that verified `verified` proposed tokens (from `source`, the winning
        branch's for a tree of `tree_extra` nodes beyond its longer branch) and committed `committed`
        tokens, the first `accepted` of them proposed (verified = 0: a plain step)."""
        if verified == 0:
            self.plain_steps += 1
            return
        self.cycles += 1
        if tree_extra is not None:
            self.tree_cycles += 1
            self.tree_extra_tokens += tree_extra
        self.cycles_by_source[source] = self.cycles_by_source.get(source, 0) + 1
        self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + accepted
        self.committed_per_cycle.append(committed)
        self.drafts_per_cycle.append(verified)
        for k in range(accepted):
            self.accepted_at_position[k] += 1

    @property
    def acceptance_length(self) -> float:
        return sum(self.committed_per_cycle) / self.cycles if self.cycles else 0.0

    @property
    def tokens_per_pass(self) -> float:
        passes = self.cycles + self.plain_steps
        return max(self.new_tokens - 1, 0) / passes if passes else 0.0

    @property
    def mean_drafts_verified(self) -> float:
        return sum(self.drafts_per_cycle) / self.cycles if self.cycles else 0.0

    def histogram(self) -> dict[int, int]:
        return {tau: self.committed_per_cycle.count(tau) for tau in range(1, self.block_size + 1)}

    def position_acceptance(self) -> list[float]:
        """Fraction of speculative cycles in which drafts 1..k were all accepted, k = 1..B-1."""
        return [n / self.cycles if self.cycles else 0.0 for n in self.accepted_at_position]

    def as_dict(self) -> dict:
        return {"new_tokens": self.new_tokens, "cycles": self.cycles, "plain_steps": self.plain_steps,
                "acceptance_length": self.acceptance_length, "tokens_per_pass": self.tokens_per_pass,
                "mean_drafts_verified": self.mean_drafts_verified, "histogram": self.histogram(),
                "position_acceptance": self.position_acceptance(),
                "cycles_by_source": dict(self.cycles_by_source), "accepted_by_source": dict(self.accepted_by_source),
                "tree_cycles": self.tree_cycles, "tree_extra_tokens": self.tree_extra_tokens,
                "draft_lengths": {k: self.drafts_per_cycle.count(k) for k in sorted(set(self.drafts_per_cycle))}}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RowStats":
        return cls(**data)


@dataclass
class BatchTiming:
    prefill_seconds: float = 0.0
    total_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    plain_steps: int = 0             # one-token batch steps: no draft pass, nothing verified (fallback / never)
    plain_seconds: float = 0.0       # their wall time
    plain_tokens: int = 0            # the tokens they committed (one per row and step)
    speculative_cycles: int = 0
    draft_passes: int = 0            # cycles that ran the draft pass (the others proposed by lookup or not at all)
    cycle_cpu_seconds: float = 0.0   # process CPU time of all cycles (prefill excluded): not stretched by a host's steal

    def record_cycle(self, b: int, drafted: bool, width: int, seconds: float, cpu_seconds: float) -> None:
        """One cycle of b rows: `width` tokens a row through the target, after a draft pass or not."""
        if not drafted and width == 1:
            self.plain_steps += 1
            self.plain_seconds += seconds
            self.plain_tokens += b
        else:
            self.speculative_cycles += 1
        self.draft_passes += int(drafted)
        self.cycle_cpu_seconds += cpu_seconds

    def as_dict(self) -> dict:
        return asdict(self)

    to_dict = as_dict

    @classmethod
    def from_dict(cls, data: dict) -> "BatchTiming":
        return cls(**data)


@dataclass
class Commit:
    tokens: list[int]
    accepted: int = 0    # the leading `accepted` tokens were proposed tokens
    drafted: int = 0     # proposed tokens this cycle verified (0: a plain step, or the prefill's token)
    source: str = ""     # where they came from: "draft", "lookup", "" (none)
    tree_extra: int | None = None   # a tree's nodes beyond its longer branch (None: one path verified)
