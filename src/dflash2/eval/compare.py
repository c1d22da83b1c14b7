"""`generate --compare`: the speculative decoder against the autoregressive baseline, like with like.

Contract: `compare(decoder, ids, config, run=None)` -> `Comparison`. First an untimed warm-up:
each of the two decoders (the speculative one, and its plain-decoding `variant` on the same
target) decodes `ids` for at most `WARMUP_TOKENS` tokens, so the one-time costs of a process
(the first prefill of this prompt's length, the allocator, kernel and thread-pool set-up, the cost
model's calibration) fall on neither timed run. Then the timed runs: `run(timed)` (default
`timed.generate([ids], config)[0]`; the CLI streams), `timed` the decoder's `variant()` (its cost
model, nothing of what the warm-up taught it of this very prompt), and the baseline's. Each run's time is its own session's, so the warm-up counts in
neither. `Comparison.speedup` is the ratio of their tokens per second.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from dflash2.decoding.loop.engine import GenerationConfig, GenerationResult, SpeculativeDecoder

WARMUP_TOKENS = 16


def _tokens_per_second(result: GenerationResult) -> float:
    seconds = result.timing.total_seconds
    return result.stats.new_tokens / seconds if seconds else 0.0


@dataclass
class Comparison:
    speculative: GenerationResult
    baseline: GenerationResult

    @property
    def baseline_tokens_per_second(self) -> float:
        return _tokens_per_second(self.baseline)

    @property
    def speedup(self) -> float:
        return _tokens_per_second(self.speculative) / max(self.baseline_tokens_per_second, 1e-12)

    @property
    def identical(self) -> bool:
        return self.speculative.tokens == self.baseline.tokens


def warm_up(decoders: tuple[SpeculativeDecoder, ...], ids: list[int], config: GenerationConfig) -> None:
    short = replace(config, max_new_tokens=min(config.max_new_tokens, WARMUP_TOKENS))
    for decoder in decoders:
        decoder.generate([ids], short)


def compare(decoder: SpeculativeDecoder, ids: list[int], config: GenerationConfig,
            run: Callable[[SpeculativeDecoder], GenerationResult] | None = None) -> Comparison:
    baseline = decoder.variant(speculate="never")
    warm_up((decoder, baseline), ids, config)
    timed = decoder.variant()
    speculative = run(timed) if run is not None else timed.generate([ids], config)[0]
    return Comparison(speculative, baseline.generate([ids], config)[0])
