"""Speculative decoding: proposers offer tokens, the target verifies them in one pass per cycle, and a
policy decides how many to verify. Output is the target's own (greedy) or follows its distribution
exactly (sampled), whatever is proposed.

Rooms (imports run from the loop down to the others):
- `loop/`: the decoding loop (`engine`: `SpeculativeDecoder`, `DecodeSession`), what a cycle
  verifies (`block`), the acceptance rules (`acceptance`), per-row sampling, stats, timing, context.
- `policy/`: when to speculate and how much to verify: a pure `chooser` and one `learner`
  (`SpeculationPolicy`), their records (`cycle`), the cost model and its stored calibration.
- `proposers/`: where proposed tokens come from: the draft model (`draft`), lookup (`lookup`),
  token trees (`tree`), and which proposer and block size a decoder gets (`kinds`).
- `verifier/`: the target side: `TargetAdapter` (`adapter`), its in-place KV cache (`kvcache`),
  ragged left-padded batches (`ragged`), hybrid targets' recurrent state (`recurrent`).
The face below is what commands and users import.
"""
from dflash2.decoding.loop.engine import DecodeSession, SpeculativeDecoder
from dflash2.decoding.loop.requests import Event, GenerationConfig, GenerationResult
from dflash2.decoding.policy import SPECULATE_MODES, SpeculationPolicy
from dflash2.decoding.proposers.kinds import PROPOSERS
from dflash2.decoding.verifier.adapter import TargetAdapter

__all__ = ["DecodeSession", "Event", "GenerationConfig", "GenerationResult", "PROPOSERS", "SPECULATE_MODES",
           "SpeculationPolicy", "SpeculativeDecoder", "TargetAdapter"]
