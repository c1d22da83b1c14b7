"""When to speculate and how many draft tokens to verify: the cost side of the decoding loop.

Contract:
- `SpeculationPolicy(mode, costs)`, mode `auto` | `always` | `never`:
  - `never`: plain decoding, no draft pass, ever.
  - `always`: a draft pass every cycle and the whole block verified (the classical loop).
  - `auto` (the default): per cycle, verify only as many draft tokens as pay for themselves, and
    fall back to plain decoding for the batch when speculation does not pay, probing again later.
- `plan(b)` -> `CyclePlan(draft, probe)`: whether this cycle runs the draft (False: a plain
  one-token step), and whether it is a probe (verify the whole block to re-measure acceptance).
- `choose_length(b, confidence, greedy, block)` -> number of drafts to verify (0..block-1), chosen
  to maximise expected committed tokens per second:
      rate(k) = sum_r E_r(k) / (t_draft(b) + t_verify(b, k + 1) + t_host),
      E_r(k) = 1 + sum_{i<=k} prod_{j<=i} a_{r,j},
  where a_{r,j} is the calibrated probability that draft j of row r is accepted given drafts
  1..j-1 were (`AcceptanceModel`, from the draft's own confidence in the token), and the times come
  from `costs` (`decoding.costs.CostModel`). When even the best rate is below plain decoding's,
  b / (t_verify(b, 1) + t_host), for `patience` cycles in a row, the policy falls back for
  `backoff` plain steps (doubling after each failed probe, up to `max_backoff`).
- `observe(...)` feeds back what a cycle did: the acceptance per row (calibration) and the
  measured times (costs).
All numbers are plain Python floats: the policy changes what is verified, never what is output
(acceptance is exact for any number of verified drafts).
"""
from __future__ import annotations

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

    def probabilities(self, confidence: list[float], greedy: bool) -> list[float]:
        table = self._table(greedy)
        return [table[self._bin(c)][0] / table[self._bin(c)][1] for c in confidence]

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


class SpeculationPolicy:
    def __init__(self, mode: str = "auto", costs: CostModel | None = None, patience: int = 3,
                 min_backoff: int = 8, max_backoff: int = 512, margin: float = 0.0):
        if mode not in SPECULATE_MODES:
            raise ValueError(f"speculate mode must be one of {', '.join(SPECULATE_MODES)}, got {mode!r}")
        self.mode = mode
        self.costs = costs or CostModel()
        self.acceptance = AcceptanceModel()
        self.patience, self.min_backoff, self.max_backoff, self.margin = patience, min_backoff, max_backoff, margin
        self.backoff = min_backoff
        self.losing = 0          # consecutive cycles whose best rate was below plain decoding's
        self.plain_left = 0      # plain steps left in the current fallback
        self.probing = True      # the first cycle measures acceptance with the whole block

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

    def plain_rate(self, b: int) -> float:
        return b / max(self.costs.verify(b, 1) + self.costs.host(b, False), 1e-9)

    def rate(self, b: int, expected: float, k: int) -> float:
        return expected / max(self.costs.draft(b) + self.costs.verify(b, k + 1) + self.costs.host(b, True), 1e-9)

    def _best(self, b: int, confidence: list[list[float]], greedy: list[bool], drafts: int) -> tuple[int, float]:
        """(k, rate) of the most productive number of drafts to verify."""
        probabilities = [self.acceptance.probabilities(c, g) for c, g in zip(confidence, greedy)]
        best_k, best_rate = 0, -1.0
        for k in range(drafts + 1):
            rate = self.rate(b, sum(expected_tokens(p, k) for p in probabilities), k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def _pays(self, b: int, rate: float) -> bool:
        return rate >= self.plain_rate(b) * (1 + self.margin)

    def choose_length(self, b: int, confidence: list[list[float]], greedy: list[bool], block: int,
                      probe: bool = False) -> int:
        drafts = block - 1
        if self.mode == "always" or probe:
            return drafts
        best_k, best_rate = self._best(b, confidence, greedy, drafts)
        if self._pays(b, best_rate):
            self.losing, self.backoff = 0, self.min_backoff
        else:
            self.losing += 1
            if self.losing >= self.patience:
                self._fall_back()
        return best_k

    def _fall_back(self) -> None:
        self.plain_left = self.backoff
        self.backoff = min(self.backoff * 2, self.max_backoff)
        self.losing = 0

    # ------------------------------------------------------------------ feedback
    def observe(self, b: int, q: int, confidence: list[list[float]] | None, greedy: list[bool],
                verified: list[int], accepted: list[int], draft_seconds: float | None, verify_seconds: float,
                host_seconds: float, probe: bool = False) -> None:
        """What a cycle did: it ran q tokens per row through the target (verified[r] of them drafts
        of row r, accepted[r] accepted); draft_seconds is None for a plain step."""
        self.costs.observe_verify(b, q, verify_seconds)
        self.costs.observe_host(b, draft_seconds is not None, host_seconds)
        if draft_seconds is not None:
            self.costs.observe_draft(b, draft_seconds)
        if confidence is not None:
            for c, g, v, a in zip(confidence, greedy, verified, accepted):
                self.acceptance.observe(c, g, v, a)
        if probe and self.mode == "auto":  # judge the probe with what it just measured
            self.probing = False
            _, rate = self._best(b, confidence, greedy, len(confidence[0]) if confidence else 0)
            if self._pays(b, rate):
                self.losing, self.backoff = 0, self.min_backoff
            else:
                self._fall_back()
