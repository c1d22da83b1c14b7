"""The objective of a fixed batch: the time until its last row ends.

A fixed batch (every row known from the start, none waiting to join: `generate`, `bench`) is done
when its last row is, and each pass costs what the rows still in it make it cost; a batch that
refills from a queue (the server) is not, and keeps the policy's tokens-per-second objective.

Contract:
- `plain_seconds(remaining, step)`: how long plain decoding takes to finish rows that may still
  commit `remaining[r]` tokens (floats allowed), `step[n - 1]` the seconds of a plain step of n rows:
  all rows run until the shortest ends, then one row fewer, and so on:
      P(R) = sum_i (R_(i) - R_(i-1)) * step(b - i + 1),   R_(1) <= ... <= R_(b), R_(0) = 0.
- `step_curve(b, seconds)`: `step` for 1..b rows from `seconds(n)` evaluated at powers of two and at
  b only (linear between them): a batch of thousands of rows asks the cost model a dozen times;
  never decreasing in n (noisy timings can say 4 rows cost less than 3: a step of n rows is taken
  at the dearest of 1..n, so that no cycle saves a negative time).
- `saved_seconds(remaining, expected, step)`: the plain decoding time that a cycle committing
  `expected[r]` tokens to row r (at most `remaining[r]`) saves: P(R) - P(R - E). A plain step saves
  step(b) exactly (every row has a token left).
The policy rates a cycle of a fixed batch by saved seconds per second it takes: the choice that
leaves plain decoding the least to do per second spent, i.e. one step of policy improvement over
plain decoding (a rollout whose continuation is plain decoding), so in expectation the last row
ends no later than under plain decoding. Where a pass costs per token (step(n) proportional to n)
this is the tokens-per-second rule (saved = step(1) * sum E); where it costs the same for any
number of rows (step(n) constant) and the rows have the same room left, it is the progress of the
row that advances least (saved = step * min E): a row that lookup finds nothing for then holds the
batch to plain steps, since a wide pass would only make it wait longer.
"""
from __future__ import annotations

from typing import Callable


def plain_seconds(remaining: list[float], step: list[float]) -> float:
    total, before, b = 0.0, 0.0, len(remaining)
    for i, r in enumerate(sorted(remaining)):
        total += (r - before) * step[b - i - 1]
        before = r
    return total


def saved_seconds(remaining: list[float], expected: list[float], step: list[float]) -> float:
    after = [r - min(e, r) for r, e in zip(remaining, expected)]
    return plain_seconds(remaining, step) - plain_seconds(after, step)


def step_curve(b: int, seconds: Callable[[int], float]) -> list[float]:
    points = sorted({b} | {1 << i for i in range(b.bit_length()) if 1 << i < b})
    known = [(n, seconds(n)) for n in points]
    steps = [known[0][1]]
    for (n0, s0), (n1, s1) in zip(known, known[1:]):
        steps += [s0 + (s1 - s0) * (n - n0) / (n1 - n0) for n in range(n0 + 1, n1 + 1)]
    for n in range(1, len(steps)):
        steps[n] = max(steps[n], steps[n - 1])
    return steps
