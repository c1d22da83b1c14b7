"""When to speculate and how many proposed tokens to verify.

- `learner`: `SpeculationPolicy`, the one object that learns (only from `observe(record)`):
  `prepare(b, offer, block)` -> a `CyclePlan` whose `choose` is the pure `chooser`.
- `chooser`: the choice as pure functions of (acceptance tables, costs, settings, offer).
- `cycle`: the values between engine and policy (`Offer`, `CyclePlan`, `Choice`, `CycleRecord`, `Backoff`).
- `costs`: the cost model of a cycle and its start-up calibration, stored per machine.
- `expectation`: the calibrated acceptance of proposed tokens, expected tokens (of a tree too), and
  the plain decoding time a fixed batch's cycle saves.
"""
from dflash2.decoding.policy.chooser import SPECULATE_MODES
from dflash2.decoding.policy.learner import SpeculationPolicy

__all__ = ["SPECULATE_MODES", "SpeculationPolicy"]
