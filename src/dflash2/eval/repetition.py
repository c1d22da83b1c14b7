"""How much of an answer repeats itself, and which answers loop.

Contract:
- `repeated_ngram_share(tokens, n=4)`: of the answer's n-grams (token ids, one starting at each
  position 0 .. len-n), the share equal to an n-gram that starts earlier in the same answer; 0.0
  for an answer shorter than n tokens. Text that repeats itself is text n-gram lookup can copy.
- An answer **loops** when that share exceeds `LOOP_THRESHOLD` (0.2: more than one 4-gram in
  five repeats an earlier one of the same answer; natural prose, worked arithmetic and code of a
  128-256-token answer stay below it, a paragraph or list item said again goes above).
- `loops(tokens)` applies it; `RepetitionSummary.of(answers)` gives the mean share over the
  answers, how many loop and how many there are (what bench reports per dataset).
Pure functions of the token ids.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

NGRAM = 4
LOOP_THRESHOLD = 0.2


def repeated_ngram_share(tokens: Sequence[int], n: int = NGRAM) -> float:
    if n < 1:
        raise ValueError(f"n-gram length must be positive, got {n}")
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for start in range(total):
        gram = tuple(tokens[start:start + n])
        repeated += gram in seen
        seen.add(gram)
    return repeated / total


def loops(tokens: Sequence[int], threshold: float = LOOP_THRESHOLD) -> bool:
    return repeated_ngram_share(tokens) > threshold


@dataclass(frozen=True)
class RepetitionSummary:
    mean_share: float | None     # mean over the answers of their repeated 4-gram share (None: no answers)
    looping: int                 # answers whose share exceeds `threshold`
    answers: int
    threshold: float = LOOP_THRESHOLD
    ngram: int = NGRAM

    @classmethod
    def of(cls, answers: Sequence[Sequence[int]]) -> "RepetitionSummary":
        shares = [repeated_ngram_share(a) for a in answers]
        return cls(sum(shares) / len(shares) if shares else None, sum(s > LOOP_THRESHOLD for s in shares), len(shares))

    def to_dict(self) -> dict:
        return asdict(self)
