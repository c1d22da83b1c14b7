"""What a cycle is expected to give: acceptance probabilities, expected tokens and plain-step times.

- `AcceptanceModel`: P(a reached token is accepted | its confidence bin), greedy and sampled rows
  apart, as Beta counts whose prior follows the table's calibration so far (`scale`).
- `expectations_by_length(p)`: E(k) = 1 + sum_{i<=k} prod_{j<=i} p_j, the tokens a cycle commits
  when k proposed tokens are verified; `tree_options`: the same for two branches as one tree.
- A fixed batch ends with its last row: `saved_seconds` is what a cycle saves of the plain decoding
  time that takes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

BINS = 10             # confidence bins of a table
PRIOR_WEIGHT = 2.0    # reached tokens a bin starts with, accepted at its mid confidence (times `scale`)


def _bin(confidence: float) -> int:
    return min(int(confidence * BINS), BINS - 1)


def _mid(i: int) -> float:
    return (i + 0.5) / BINS


def _prior() -> list[list[float]]:
    return [[PRIOR_WEIGHT * _mid(i), PRIOR_WEIGHT] for i in range(BINS)]


@dataclass
class AcceptanceModel:
    scale_weight: float = 2.0   # the prior weight of the table-wide calibration (`scale`)
    counts: dict[bool, list[list[float]]] = field(default_factory=dict)  # greedy -> [bin] -> [accepted, reached]
    totals: dict[bool, list[float]] = field(default_factory=dict)  # greedy -> [accepted, sum of the reached bins' mids]

    def scale(self, greedy: bool) -> float:
        """Accepted over what the bins' mid confidences predicted, over everything observed."""
        accepted, predicted = self.totals.get(greedy, (0.0, 0.0))
        return (accepted + self.scale_weight) / (predicted + self.scale_weight)

    def probabilities(self, confidence: list[float], greedy: bool, optimism: float = 0.0) -> list[float]:
        """Each token's posterior mean plus `optimism` standard deviations."""
        table, scale, out = self.counts.get(greedy) or _prior(), self.scale(greedy), []
        for c in confidence:
            i = _bin(c)
            accepted, reached = table[i]
            mean = (accepted + PRIOR_WEIGHT * (min(_mid(i) * scale, 1.0) - _mid(i))) / reached
            out.append(min(mean + optimism * math.sqrt(mean * (1 - mean) / (reached + 1)), 1.0))
        return out

    def observe(self, confidence: list[float], greedy: bool, verified: int, accepted: int) -> None:
        """Tokens 1..verified were verified and 1..accepted accepted: 1..min(accepted + 1, verified) reached."""
        table, totals = self.counts.setdefault(greedy, _prior()), self.totals.setdefault(greedy, [0.0, 0.0])
        for j in range(min(accepted + 1, verified)):
            i, hit = _bin(confidence[j]), 1.0 if j < accepted else 0.0
            table[i][0] += hit
            table[i][1] += 1.0
            totals[0] += hit
            totals[1] += _mid(i)


def expectations_by_length(probabilities: list[float], reach: float = 1.0, first: float = 1.0) -> list[float]:
    """[E(0), ..., E(len)]; `reach`: the chance the first token is reached, `first`: E(0)."""
    out = [first]
    for a in probabilities:
        reach *= a
        out.append(out[-1] + reach)
    return out


def tree_options(draft: list[float], second: list[float], shared: int) -> list[tuple[float, int, int, int]]:
    """Two branches sharing their first `shared` tokens -> per width (nodes) the best (expected tokens,
    nodes, draft length, second length); [] when one is a prefix of the other."""
    if shared >= min(len(draft), len(second)):
        return []
    common = [max(a, c) for a, c in zip(draft[:shared], second[:shared])]   # shared: the likelier source's p
    base, reach = expectations_by_length(common)[-1], math.prod(common)
    both = draft[shared] + second[shared]
    start = reach / both if both > 1 else reach          # the two diverging tokens: at most one accepted
    draft_gain, second_gain = (expectations_by_length(p[shared:], start, 0.0) for p in (draft, second))
    best = [(0.0, 0, 0, 0)] * (len(draft) + len(second) - shared + 1)
    for i in range(1, len(draft_gain)):
        for j in range(1, len(second_gain)):
            expected = base + draft_gain[i] + second_gain[j]
            if expected > best[shared + i + j][0]:
                best[shared + i + j] = (expected, shared + i + j, shared + i, shared + j)
    for w in range(1, len(best)):
        if best[w - 1][0] > best[w][0]:
            best[w] = best[w - 1]
    return best


def plain_seconds(remaining: list[float], step: list[float]) -> float:
    """Plain decoding's time to finish rows with `remaining` tokens, `step[n - 1]` a step of n rows."""
    total, before, b = 0.0, 0.0, len(remaining)
    for i, r in enumerate(sorted(remaining)):
        total += (r - before) * step[b - i - 1]
        before = r
    return total


def saved_seconds(remaining: list[float], expected: list[float], step: list[float]) -> float:
    after = [r - min(e, r) for r, e in zip(remaining, expected)]
    return plain_seconds(remaining, step) - plain_seconds(after, step)


def step_curve(b: int, seconds: Callable[[int], float]) -> list[float]:
    """A plain step of 1..b rows from `seconds(n)` at powers of two and b, never decreasing."""
    points = sorted({b} | {1 << i for i in range(b.bit_length()) if 1 << i < b})
    known = [(n, seconds(n)) for n in points]
    steps = [known[0][1]]
    for (n0, s0), (n1, s1) in zip(known, known[1:]):
        steps += [s0 + (s1 - s0) * (n - n0) / (n1 - n0) for n in range(n0 + 1, n1 + 1)]
    for n in range(1, len(steps)):
        steps[n] = max(steps[n], steps[n - 1])
    return steps
