"""The lossless audit: every greedy mismatch against plain decoding, a near-tie or a defect.

Contract:
- A greedy (T=0) output that differs from plain decoding's at the same precision is examined at
  its first divergence: the float32 target's logits after the prompt and the common prefix
  (`Reference`: the target's weights at float32, the whole sequence in one cache-free pass) give
  the margin between the two tokens, |z(a) - z(b)|. A margin within `NEAR_TIE_BOUNDS[dtype]` is a
  numerical near-tie (the two tokens were tied within what that precision's rounding moves a
  logit difference); above it, or where one output merely stops early, a defect: no rounding
  explains it, the decoder chose a token the target did not.
- `NEAR_TIE_BOUNDS`: per precision, the measured bound on how far one decoding's difference of two
  logits strays from the float32 target's (`scripts/precision/study.py bound`,
  docs/precision.md, the near-tie bound). If plain decoding picked a and the other decoding b, one of them ordered a and b
  against the float32 margin, so its error was at least that margin: a margin above the bound is
  beyond what rounding did anywhere it was measured.
- `audit(pairs, reference, dtype)`: pairs of (prompt ids, plain output, other output) ->
  `Audit` (compared, mismatches, near_ties, defects, worst_margin: the largest margin of any
  mismatch with two tokens to compare, bound, and each `Divergence`). The reference is loaded (`reference()`, a callable)
  only when a mismatch needs it. `Audit.to_dict()` is what results files and `--json` hold;
  `Audit.line()` says it in one line; `Audit.merged(others)` pools audits.
- `reference_loader(pipeline)`: the callable for a pipeline: its own target when it runs at
  float32, else the same weights loaded at float32 on its device (once, on first use); a target
  run on quantized weights (`--weights int4`) is referred to those weights dequantized
  (`model.projections.dequantized_into`), since that target, not the float one, is what plain
  decoding and speculation must agree on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

# Measured (`scripts/precision/study.py bound`, 12 prompts of the six-kind set, SmolLM2, 1,348
# positions, docs/precision.md, the near-tie bound): the largest deviation of a bfloat16 decoding's top-two logit
# difference from the float32 target's was 0.39 (p99.9 0.36; one-token steps and 8-token verify
# passes, bfloat16 or float32 head); float32 passes differ by ~1e-5 (the fp32 tie of BENCHMARKS.md
# section 1.1 was 2.3e-5). The bounds leave room above those; float16's is not measured (bfloat16's
# scaled by float16's 8x finer rounding, doubled).
NEAR_TIE_BOUNDS = {"bfloat16": 0.5, "float16": 0.1, "float32": 1e-3}


@dataclass
class Divergence:
    position: int                     # index in the generated tokens
    plain_token: int | None
    other_token: int | None
    margin: float | None              # |z(plain) - z(other)| of the float32 target; None: one output ended
    kind: str                         # "near-tie" | "defect"

    def to_dict(self) -> dict:
        return {"position": self.position, "plain_token": self.plain_token, "other_token": self.other_token,
                "margin": self.margin, "kind": self.kind}


@dataclass
class Audit:
    dtype: str
    bound: float
    compared: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return len(self.divergences)

    @property
    def near_ties(self) -> int:
        return sum(d.kind == "near-tie" for d in self.divergences)

    @property
    def defects(self) -> int:
        return sum(d.kind == "defect" for d in self.divergences)

    @property
    def worst_margin(self) -> float | None:
        """The largest float32 margin of a mismatch (None: no mismatch had two tokens to compare)."""
        margins = [d.margin for d in self.divergences if d.margin is not None]
        return max(margins) if margins else None

    def to_dict(self) -> dict:
        return {"compared": self.compared, "mismatches": self.mismatches, "near_ties": self.near_ties,
                "defects": self.defects, "worst_margin": self.worst_margin, "near_tie_bound": self.bound,
                "dtype": self.dtype, "divergences": [d.to_dict() for d in self.divergences]}

    def line(self) -> str:
        if not self.mismatches:
            return f"identical to plain decoding in {self.compared} of {self.compared}"
        worst = self.worst_margin
        shown = "none: an output stops early" if worst is None else f"{worst:.3g}"
        return (f"{self.mismatches} of {self.compared} differ from plain {self.dtype} decoding: {self.near_ties} "
                f"numerical near-tie(s), {self.defects} defect(s) (worst float32 margin {shown}; near-tie bound "
                f"{self.bound:g})")

    @classmethod
    def merged(cls, audits: list["Audit"], dtype: str) -> "Audit":
        out = cls(dtype, NEAR_TIE_BOUNDS.get(dtype, NEAR_TIE_BOUNDS["bfloat16"]))
        for one in audits:
            out.compared += one.compared
            out.divergences += one.divergences
        return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where the two differ (one ending counts); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class Reference:
    """The target at float32: the next-token logits after a sequence, in one cache-free pass."""

    def __init__(self, model):
        self.model = model

    def logits(self, ids: list[int]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=device), logits_to_keep=1)
        return out.logits[0, -1].float()


def classify(reference: Reference, prompt: list[int], plain: list[int], other: list[int], index: int,
             bound: float) -> Divergence:
    a = plain[index] if index < len(plain) else None
    b = other[index] if index < len(other) else None
    if a is None or b is None:
        return Divergence(index, a, b, None, "defect")
    z = reference.logits(prompt + plain[:index])
    margin = float((z[a] - z[b]).abs())
    return Divergence(index, a, b, margin, "near-tie" if margin <= bound else "defect")


def audit(pairs: Iterable[tuple[list[int], list[int], list[int]]], reference: Callable[[], Reference],
          dtype: str) -> Audit:
    result = Audit(dtype, NEAR_TIE_BOUNDS.get(dtype, NEAR_TIE_BOUNDS["bfloat16"]))
    loaded: Reference | None = None
    for prompt, plain, other in pairs:
        result.compared += 1
        index = first_divergence(plain, other)
        if index is None:
            continue
        loaded = loaded or reference()
        result.divergences.append(classify(loaded, prompt, plain, other, index, result.bound))
    return result


def reference_loader(pipeline) -> Callable[[], Reference]:
    """See the contract: the pipeline's own target at float32, else its weights loaded at float32."""
    def load() -> Reference:
        own, weights = pipeline.decoder.target.model, pipeline.precision.weights
        if (pipeline.precision.name == "float32" and weights == "float") or pipeline.target_files is None:
            return Reference(own)
        from dflash2.targets.builtin import load_target_model
        from dflash2.model.projections import dequantized_into

        model = load_target_model(pipeline.target_files, pipeline.device, torch.float32)
        if weights != "float":   # the quantized target's own weights, at float32
            dequantized_into(model, weights, pipeline.precision.torch_dtype)
        return Reference(model)
    cached: list[Reference] = []

    def once() -> Reference:
        if not cached:
            cached.append(load())
        return cached[0]
    return once
