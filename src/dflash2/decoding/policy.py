"""When to speculate and how many draft tokens to verify: the cost side of the decoding loop.

Contract:
- `SpeculationPolicy(mode, costs)`, mode `auto` | `always` | `never`:
  - `never`: plain decoding, no draft pass, ever.
  - `always`: a draft pass every cycle and the whole block verified (the classical loop).
  - `auto` (the default): per cycle, verify only as many draft tokens as pay for themselves, and
    fall back to plain decoding for the batch when speculation does not pay, probing again later.
- `plan(b)` -> `CyclePlan(draft, probe)`: whether this cycle runs the draft (False: a plain
  one-token step), and whether it is a probe (the first speculative cycle of the decoder or after
  a fallback: its length is chosen optimistically, to learn what the draft is worth).
- `drafted(b, seconds)`: the draft pass just ran and took `seconds` (known before the length is
  chosen, so even the first choice weighs it).
- `choose_length(b, confidence, greedy, block, probe)` -> number of drafts to verify (0..block-1),
  chosen to maximise expected committed tokens per second:
      rate(k) = sum_r E_r(k) / (t_draft(b) + t_verify(b, k + 1) + t_host),
      E_r(k) = 1 + sum_{i<=k} prod_{j<=i} a_{r,j},
  where a_{r,j} is the calibrated probability that draft j of row r is accepted given drafts
  1..j-1 were (`AcceptanceModel`, from the draft's own confidence in the token; in a probe its
  optimistic bound, mean + `optimism` standard deviations), and the times come from `costs`
  (`decoding.costs.CostModel`). Plain decoding's rate is b / (t_verify(b, 1) + t_host).
- Falling back: at once when the best length is 0 or, in a probe, when even the optimistic best
  rate is below plain decoding's (the draft pass was the only cost: nothing is verified), when the
  best rate stays below plain decoding's for `patience` cycles, or when a probe, judged with what
  it measured, did not pay. A fallback lasts long enough that what the failed speculation lost,
  the cycle's time beyond that of plain steps committing its expected tokens, is at most
  `budget` of the fallback's time; at least `backoff` steps, which doubles after each fallback
  (up to `max_backoff`) and returns to `min_backoff` once speculation pays. So a draft that never
  pays costs at most `budget` of plain decoding's time after its first probe.
- `fresh()`: a policy with the same settings and cost model that has learned nothing of the draft.
- `observe(...)` feeds back what a cycle did: the acceptance per row (calibration) and the
  measured times (costs).
All numbers are plain Python floats: the policy changes what is verified, never what is output
(acceptance is exact for any number of verified drafts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dflash2.decoding.costs import CostModel

SPECULATE_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class CyclePlan:
    draft: bool
    probe: bool = False


@dataclass
class AcceptanceModel:
    """P(draft accepted | it was reached, the draft's confidence in it), per confidence bin, learned
    online (Beta counts), separately for greedy and for sampled rows. The prior of a bin is its
    mid confidence with the weight of two observations."""
    bins: int = 10
    prior_weight: float = 2.0
    counts: dict[bool, list[list[float]]] = field(default_factory=dict)  # greedy -> [bin] -> [accepted, reached]

    def _table(self, greedy: bool) -> list[list[float]]:
        if greedy not in self.counts:
            self.counts[greedy] = [[self.prior_weight * (i + 0.5) / self.bins, self.prior_weight]
                                   for i in range(self.bins)]
        return self.counts[greedy]

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def probabilities(self, confidence: list[float], greedy: bool, optimism: float = 0.0) -> list[float]:
        """The posterior mean per position, plus `optimism` posterior standard deviations (at most 1)."""
        out = []
        table = self._table(greedy)
        for c in confidence:
            accepted, reached = table[self._bin(c)]
            mean = accepted / reached
            out.append(min(mean + optimism * math.sqrt(mean * (1 - mean) / (reached + 1)), 1.0))
        return out

    def observe(self, confidence: list[float], greedy: bool, verified: int, accepted: int) -> None:
        """Positions 1..verified were verified; drafts 1..accepted were accepted, so positions
        1..min(accepted + 1, verified) were reached."""
        table = self._table(greedy)
        for j in range(min(accepted + 1, verified)):
            cell = table[self._bin(confidence[j])]
            cell[0] += 1.0 if j < accepted else 0.0
            cell[1] += 1.0


def expected_tokens(probabilities: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j: expected tokens committed when k drafts are verified."""
    total, reach = 1.0, 1.0
    for a in probabilities[:k]:
        reach *= a
        total += reach
    return total


@dataclass(frozen=True)
class Choice:
    """The most productive number of drafts to verify this cycle: k, the expected tokens it
    commits summed over the rows, and the rate (tokens per second) that gives."""
    k: int
    expected: float
    rate: float


class SpeculationPolicy:
    def __init__(self, mode: str = "auto", costs: CostModel | None = None, patience: int = 3,
                 min_backoff: int = 8, max_backoff: int = 512, budget: float = 0.02, optimism: float = 1.0,
                 margin: float = 0.0):
        if mode not in SPECULATE_MODES:
            raise ValueError(f"speculate mode must be one of {', '.join(SPECULATE_MODES)}, got {mode!r}")
        self.mode = mode
        self.costs = costs or CostModel()
        self.acceptance = AcceptanceModel()
        self.patience, self.min_backoff, self.max_backoff, self.margin = patience, min_backoff, max_backoff, margin
        self.budget, self.optimism = budget, optimism
        self.backoff = min_backoff
        self.losing = 0          # consecutive cycles whose best rate was below plain decoding's
        self.plain_left = 0      # plain steps left in the current fallback
        self.probing = True      # the next speculative cycle is a probe (the first one, or after a fallback)

    def fresh(self) -> "SpeculationPolicy":
        """The same settings and cost model, nothing learned of the draft, no fallback under way."""
        return SpeculationPolicy(self.mode, self.costs, self.patience, self.min_backoff, self.max_backoff,
                                 self.budget, self.optimism, self.margin)

    # ------------------------------------------------------------------ decisions
    def plan(self, b: int) -> CyclePlan:
        if self.mode == "never":
            return CyclePlan(draft=False)
        if self.mode == "always":
            return CyclePlan(draft=True)
        if self.plain_left > 0:
            self.plain_left -= 1
            if self.plain_left == 0:
                self.probing = True
            return CyclePlan(draft=False)
        return CyclePlan(draft=True, probe=self.probing)

    def drafted(self, b: int, seconds: float) -> None:
        self.costs.observe_draft(b, seconds)

    def plain_step_seconds(self, b: int) -> float:
        return self.costs.verify(b, 1) + self.costs.host(b, False)

    def plain_rate(self, b: int) -> float:
        return b / max(self.plain_step_seconds(b), 1e-9)

    def cycle_seconds(self, b: int, k: int) -> float:
        return self.costs.draft(b) + self.costs.verify(b, k + 1) + self.costs.host(b, True)

    def _best(self, b: int, confidence: list[list[float]], greedy: list[bool], drafts: int,
              optimism: float = 0.0) -> Choice:
        probabilities = [self.acceptance.probabilities(c, g, optimism) for c, g in zip(confidence, greedy)]
        best = Choice(0, 0.0, -1.0)
        for k in range(drafts + 1):
            expected = sum(expected_tokens(p, k) for p in probabilities)
            rate = expected / max(self.cycle_seconds(b, k), 1e-9)
            if rate > best.rate:
                best = Choice(k, expected, rate)
        return best

    def _pays(self, b: int, rate: float) -> bool:
        return rate >= self.plain_rate(b) * (1 + self.margin)

    def _lost(self, b: int, seconds: float, tokens: float) -> float:
        """What a speculative cycle of `seconds` committing `tokens` lost against plain steps."""
        return seconds - tokens / b * self.plain_step_seconds(b)

    def choose_length(self, b: int, confidence: list[list[float]], greedy: list[bool], block: int,
                      probe: bool = False) -> int:
        drafts = block - 1
        if self.mode == "always":
            return drafts
        choice = self._best(b, confidence, greedy, drafts, self.optimism if probe else 0.0)
        if choice.k == 0 or (probe and not self._pays(b, choice.rate)):
            # nothing worth verifying, even at the optimistic bound of a probe: the draft pass was the
            # only cost, and verifying would add to it
            self._fall_back(b, self._lost(b, self.cycle_seconds(b, 0), b))
            return 0
        if probe:                              # judged in `observe`, with what it measured
            return choice.k
        if self._pays(b, choice.rate):
            self.losing, self.backoff = 0, self.min_backoff
        else:
            self.losing += 1
            if self.losing >= self.patience:
                self._fall_back(b, self._lost(b, self.cycle_seconds(b, choice.k), choice.expected))
        return choice.k

    def _fall_back(self, b: int, lost_seconds: float) -> None:
        """Plain steps long enough that `lost_seconds` is at most `budget` of their time, and at
        least `backoff` of them; the next fallback is at least twice as long."""
        needed = math.ceil(max(lost_seconds, 0.0) / max(self.budget * self.plain_step_seconds(b), 1e-12))
        self.plain_left = min(max(self.backoff, needed), self.max_backoff)
        self.backoff = min(2 * self.plain_left, self.max_backoff)
        self.losing = 0

    # ------------------------------------------------------------------ feedback
    def observe(self, b: int, q: int, confidence: list[list[float]] | None, greedy: list[bool],
                verified: list[int], accepted: list[int], draft_seconds: float | None, verify_seconds: float,
                host_seconds: float, probe: bool = False) -> None:
        """What a cycle did: it ran q tokens per row through the target (verified[r] of them drafts
        of row r, accepted[r] accepted); draft_seconds is None for a plain step (the draft pass's
        time itself came through `drafted`)."""
        self.costs.observe_verify(b, q, verify_seconds)
        self.costs.observe_host(b, draft_seconds is not None, host_seconds)
        if confidence is not None:
            for c, g, v, a in zip(confidence, greedy, verified, accepted):
                self.acceptance.observe(c, g, v, a)
        if probe and confidence is not None and self.mode == "auto" and self.plain_left == 0:
            self.probing = False               # judge the probe with what it just measured
            if self._pays(b, self._best(b, confidence, greedy, len(confidence[0])).rate):
                self.losing, self.backoff = 0, self.min_backoff
            else:
                spent = (draft_seconds or 0.0) + verify_seconds + host_seconds
                self._fall_back(b, self._lost(b, spent, sum(accepted) + b))
