"""When to speculate and how many proposed tokens to verify.

- `learner`: `SpeculationPolicy`, the one object that learns (only from `observe(record)`);
  `prepare(b, offer, block)` -> a `CyclePlan` whose `choose` is the pure `chooser`.
- `chooser`: the choice as pure functions of (acceptance tables, costs, settings, offer).
- `cycle`: the values between engine and policy (`Offer`, `CyclePlan`, `Choice`, `CycleRecord`, `Backoff`).
- `costs`: the cost model of a cycle and its start-up calibration, stored per machine.
- `expectation`: acceptance tables, expected tokens (of a tree too), a fixed batch's plain decoding time.
"""
from dflash2.decoding.policy.chooser import SPECULATE_MODES
from dflash2.decoding.policy.learner import SpeculationPolicy

__all__ = ["SPECULATE_MODES", "SpeculationPolicy"]
