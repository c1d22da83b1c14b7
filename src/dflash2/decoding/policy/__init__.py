from dflash2.decoding.policy.learner import SPECULATE_MODES, SpeculationPolicy

__all__ = ["SPECULATE_MODES", "SpeculationPolicy"]
