"""What the draft's cycles have realised: the evidence `auto` stops and restarts the draft pass on.

Contract: `GainEvidence(decay, prior)` holds an exponentially weighted mean and variance of the
gains of draft cycles, each in plain steps of its own batch (the plain decoding time the cycle
saved beyond the best choice without the draft, less the cycle's own time, divided by a plain
step's time: +1.0 gained a step, -0.25 lost a quarter of one), so that batch sizes mix.
- `add(gain)`: one draft cycle's gain, clipped to +-`clip` plain steps (a block accepted whole
  gains several: one of them must not make a run of losses look like noise); every older gain
  weighs `decay` times less.
- `age(steps)`: decoded steps without the draft pass also make the evidence older (so a draft
  switched off long ago is judged on what a new probe shows).
- `mean()` and `upper(z)` (the mean plus `z` standard errors): both shrunk towards a prior of
  `prior` cycles at gain 0 with a spread of `spread` plain steps, so that one or two cycles are weak
  evidence either way, and three that lose most of a plain step each, or eight that lose a
  quarter of one each (a draft pass with nothing verified), are strong evidence.
A pure value object: plain floats, no tensors, no clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class GainEvidence:
    decay: float = 0.99       # per draft cycle or decoded step: a memory of about 100
    prior: float = 4.0        # pseudo-cycles at gain 0, spread `spread`
    clip: float = 2.0         # plain steps: the most one cycle counts for, either way
    spread: float = 1.0       # the prior's standard deviation, plain steps
    weight: float = 0.0       # sum of the weights of the cycles seen
    total: float = 0.0        # weighted sum of their gains
    squares: float = 0.0      # weighted sum of their squared gains

    def age(self, steps: int = 1) -> None:
        factor = self.decay ** steps
        self.weight *= factor
        self.total *= factor
        self.squares *= factor

    def add(self, gain: float) -> None:
        self.age()
        gain = max(-self.clip, min(self.clip, gain))
        self.weight += 1.0
        self.total += gain
        self.squares += gain * gain

    def mean(self) -> float:
        return self.total / (self.weight + self.prior)

    def upper(self, z: float) -> float:
        """The mean plus `z` standard errors of it."""
        n = self.weight + self.prior
        mean = self.total / n
        variance = max((self.squares + self.prior * self.spread ** 2) / n - mean * mean, 0.0)
        return mean + z * math.sqrt(variance / n)
