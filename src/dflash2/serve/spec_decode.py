"""Speculative-decoding accounting by vLLM's conventions: one step per verify pass of a row, and the
per-request summary vLLM returns with `--per-request-spec-decode-metrics`.

Contract:
- `SpecStep(source, drafted, accepted)`: one speculative cycle of one request (a target pass that
  verified at least one proposed token): where the verified tokens came from (`draft`: the draft
  model, `lookup`: lookup proposals, `tree`: both, verified as a token tree in one pass), how many
  proposed tokens it verified (a tree: all of its nodes, both branches) and how many of them the
  target accepted (the bonus token is not counted, as in vLLM). Counts are the engine's: a cycle cut
  short by a stop token or the length limit counts what it committed; a stop string found later in
  the text uncounts nothing.
- `SOURCES`: the values of `source` (the `source` label of the `dflash2_spec_decode_*` metrics).
- `LEVELS`: `none` (the response is unchanged), `summary`, `detailed`.
- `request_summary(steps, num_spec_tokens, detailed)` -> the object vLLM puts at
  `metrics.speculative_decoding` of a response: `mean_acceptance_length` (1 + accepted / steps;
  1.0 without a step), `draft_acceptance_rate` (accepted / drafted; 0.0 without a drafted token),
  `acceptance_histogram` (a dense list: index j = steps that accepted exactly j tokens, j = 0 ..
  `num_spec_tokens`), `num_spec_steps`, `num_accepted_draft_tokens`, `num_draft_tokens`,
  `num_spec_tokens` (the request's block size - 1: the most tokens one step can accept); `detailed`
  adds `per_step_accepted`, `per_step_drafted` (vLLM's) and `per_step_source` (this project's).
"""
from __future__ import annotations

from dataclasses import dataclass

SOURCES = ("draft", "lookup", "tree")
LEVELS = ("none", "summary", "detailed")


@dataclass(frozen=True)
class SpecStep:
    source: str      # one of SOURCES
    drafted: int     # proposed tokens verified (> 0)
    accepted: int    # of them accepted (0 .. the block size - 1)


def request_summary(steps: list[SpecStep], num_spec_tokens: int, detailed: bool = False) -> dict:
    """vLLM's `metrics.speculative_decoding` object for one request's steps."""
    accepted = sum(step.accepted for step in steps)
    drafted = sum(step.drafted for step in steps)
    histogram = [0] * (max(num_spec_tokens, max((s.accepted for s in steps), default=0)) + 1)
    for step in steps:
        histogram[step.accepted] += 1
    summary = {
        "mean_acceptance_length": 1.0 + accepted / len(steps) if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": len(steps),
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": num_spec_tokens,
    }
    if detailed:
        summary["per_step_accepted"] = [step.accepted for step in steps]
        summary["per_step_drafted"] = [step.drafted for step in steps]
        summary["per_step_source"] = [step.source for step in steps]
    return summary
