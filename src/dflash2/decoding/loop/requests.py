"""What a request asks the decoding loop for and what it gets back.

Contract: `GenerationConfig` (a row's length limit, sampling settings, block size, stop tokens and
seed; `validate()` raises `SettingError` naming the first bad field); `GenerationResult` (a finished
row's tokens, why it finished, its statistics and its batch's timing); `Event` (what one cycle did
for one request: `commit`, and `result` once it finished).
"""
from __future__ import annotations

from dataclasses import dataclass

from dflash2.decoding.loop.stats import BatchTiming, Commit, RowStats
from dflash2.errors import SettingError


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    block_size: int | None = None          # None: the draft's own block size
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def validate(self) -> None:
        """Raise `SettingError` (the field's name, what is wrong) for the first bad field."""
        checks = (
            ("max_new_tokens", isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0, "a positive integer"),
            ("temperature", isinstance(self.temperature, (int, float)) and self.temperature >= 0
             and self.temperature != float("inf"), "a finite number >= 0"),
            ("top_p", isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "an integer >= 0"),
            ("block_size", self.block_size is None or (isinstance(self.block_size, int) and self.block_size >= 2),
             "an integer >= 2"),
            ("seed", isinstance(self.seed, int), "an integer"))
        for name, ok, wanted in checks:
            if not ok:
                raise SettingError(name, f"must be {wanted}, got {getattr(self, name)!r}")


@dataclass
class GenerationResult:
    tokens: list[int]
    finish_reason: str      # "stop" or "length"
    stats: RowStats
    timing: BatchTiming


@dataclass
class Event:
    """What one cycle did for one request (`commit`: its tokens, how many were accepted proposed tokens
    and from where); `result` is set when the request finished."""
    key: int
    commit: Commit
    result: GenerationResult | None = None

    @property
    def tokens(self) -> list[int]:
        return self.commit.tokens
