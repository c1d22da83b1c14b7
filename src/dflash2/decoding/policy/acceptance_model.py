"""How likely a proposed token is to be accepted, learned online from what verification showed.

Contract: `AcceptanceModel` holds, per confidence bin and separately for greedy and sampled rows,
Beta counts of accepted / reached proposed tokens; `probabilities(confidence, greedy, optimism)`
gives each token's posterior mean (plus `optimism` standard deviations), `observe(...)` feeds a
verified block back. `expected_tokens(p, k)` / `expectations_by_length(p)`: the expected tokens
a cycle commits when k of them are verified, E(k) = 1 + sum_{i<=k} prod_{j<=i} p_j.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class AcceptanceModel:
    """P(draft accepted | it was reached, the draft's confidence in it), per confidence bin, learned
    online (Beta counts), separately for greedy and for sampled rows. The prior of a bin is its
    mid confidence times the table's calibration so far, with the weight of two observations (see
    `scale`)."""
    bins: int = 10
    prior_weight: float = 2.0
    scale_weight: float = 2.0   # the prior weight of the table-wide calibration (`scale`)
    counts: dict[bool, list[list[float]]] = field(default_factory=dict)  # greedy -> [bin] -> [accepted, reached]
    totals: dict[bool, list[float]] = field(default_factory=dict)  # greedy -> [accepted, sum of the reached bins' mids]

    def scale(self, greedy: bool) -> float:
        """Accepted over what the bins' mid confidences predicted, over everything observed (1 with
        the prior weight before anything is): a bin that has seen little inherits how the source's
        other bins turned out (a lookup whose matches chat text rejects, a draft that is weaker or
        stronger than its confidence says), instead of being tried at its face value bin by bin."""
        accepted, predicted = self.totals.get(greedy, (0.0, 0.0))
        return (accepted + self.scale_weight) / (predicted + self.scale_weight)

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
        table, scale = self._table(greedy), self.scale(greedy)
        for c in confidence:
            i = self._bin(c)
            accepted, reached = table[i]
            mid = (i + 0.5) / self.bins
            mean = (accepted + self.prior_weight * (min(mid * scale, 1.0) - mid)) / reached
            out.append(min(mean + optimism * math.sqrt(mean * (1 - mean) / (reached + 1)), 1.0))
        return out

    def observe(self, confidence: list[float], greedy: bool, verified: int, accepted: int) -> None:
        """Positions 1..verified were verified; drafts 1..accepted were accepted, so positions
        1..min(accepted + 1, verified) were reached."""
        table = self._table(greedy)
        totals = self.totals.setdefault(greedy, [0.0, 0.0])
        for j in range(min(accepted + 1, verified)):
            i = self._bin(confidence[j])
            table[i][0] += 1.0 if j < accepted else 0.0
            table[i][1] += 1.0
            totals[0] += 1.0 if j < accepted else 0.0
            totals[1] += (i + 0.5) / self.bins


def expected_tokens(probabilities: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j: expected tokens committed when k drafts are verified."""
    total, reach = 1.0, 1.0
    for a in probabilities[:k]:
        reach *= a
        total += reach
    return total


def expectations_by_length(probabilities: list[float]) -> list[float]:
    """[E(0), E(1), ..., E(T)] of `expected_tokens` in one pass."""
    out, reach = [1.0], 1.0
    for a in probabilities:
        reach *= a
        out.append(out[-1] + reach)
    return out


