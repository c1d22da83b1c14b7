"""The speculative decoding loop (SPEC §3), readable top to bottom.

Contract:
- `SpeculativeDecoder(target, draft=None)`: `target` is a `TargetAdapter`; with `draft=None` the
  same loop decodes autoregressively (one target step per token), the honest baseline.
- `generate(prompts, config)` decodes a batch of token-id prompts together. Every row keeps its
  own acceptance (rows that accept more advance more; the caches are re-aligned, never truncated
  to the slowest row) and leaves the batch when it hits a stop token or `max_new_tokens`, both
  honoured exactly even in the middle of a block. Returns one `GenerationResult` per prompt.
- `stream(prompt, config)` yields the tokens committed by each cycle for one prompt;
  `decode_events(prompts, config)` yields (prompt index, new tokens, final result or None) for a batch.
- Greedy output equals the target's greedy output token for token; sampled output follows the
  target's processed distribution exactly (see `acceptance.py`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from dflash2.decoding.acceptance import greedy_accept, sample_accept, target_probs
from dflash2.model.draft import DFlash2DraftModel
from dflash2.errors import require
from dflash2.decoding.proposer import DraftProposer
from dflash2.decoding.target import TargetAdapter
from dflash2.decoding.timing import Stopwatch


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
        require(isinstance(self.max_new_tokens, int) and self.max_new_tokens > 0,
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        require(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature!r}")
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        require(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}")
        require(self.block_size is None or (isinstance(self.block_size, int) and self.block_size >= 2),
                f"block_size must be an integer >= 2, got {self.block_size!r}")


@dataclass
class SequenceStats:
    block_size: int
    cycles: int = 0
    committed_per_cycle: list[int] = field(default_factory=list)   # tokens each verification yielded
    accepted_at_position: list[int] = field(default_factory=list)  # cycles whose draft k was accepted
    phase_seconds: dict[str, float] = field(default_factory=dict)
    prefill_seconds: float = 0.0
    total_seconds: float = 0.0
    new_tokens: int = 0

    def __post_init__(self) -> None:
        self.accepted_at_position = [0] * max(self.block_size - 1, 0)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per verification pass (bonus counted); the prefill's token is not a pass."""
        return sum(self.committed_per_cycle) / self.cycles if self.cycles else 0.0

    def histogram(self) -> dict[int, int]:
        return {tau: self.committed_per_cycle.count(tau) for tau in range(1, self.block_size + 1)}

    def position_acceptance(self) -> list[float]:
        """Fraction of cycles in which drafts 1..k were all accepted, k = 1..B-1."""
        return [n / self.cycles if self.cycles else 0.0 for n in self.accepted_at_position]

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens, "cycles": self.cycles,
            "acceptance_length": self.acceptance_length, "histogram": self.histogram(),
            "position_acceptance": self.position_acceptance(), "prefill_seconds": self.prefill_seconds,
            "total_seconds": self.total_seconds, "phase_seconds": dict(self.phase_seconds),
            "tokens_per_second": self.new_tokens / self.total_seconds if self.total_seconds else 0.0,
        }


@dataclass
class GenerationResult:
    tokens: list[int]
    finish_reason: str      # "stop" or "length"
    stats: SequenceStats


class SpeculativeDecoder:
    def __init__(self, target: TargetAdapter, draft: DFlash2DraftModel | None = None):
        self.target = target
        self.draft = draft
        if draft is not None:
            draft.config.validate_against_target(target.model.config)
            require(target.target_layer_ids == draft.config.target_layer_ids,
                    "target adapter taps different layers than the draft's target_layer_ids")
            draft.bind_target(target.embed_weight(), target.lm_head_weight())

    # ------------------------------------------------------------------ public API
    def generate(self, prompts: list[list[int]], config: GenerationConfig) -> list[GenerationResult]:
        results: list[GenerationResult | None] = [None] * len(prompts)
        for row, _tokens, result in self.decode_events(prompts, config):
            if result is not None:
                results[row] = result
        return results  # type: ignore[return-value]

    def stream(self, prompt: list[int], config: GenerationConfig) -> Iterator[list[int]]:
        for _row, tokens, _result in self.decode_events([prompt], config):
            if tokens:
                yield tokens

    def block_size(self, config: GenerationConfig) -> int:
        return 1 if self.draft is None else (config.block_size or self.draft.config.block_size)

    def new_proposer(self, stopwatch: Stopwatch) -> DraftProposer | None:
        """The draft side of the cycle (None: autoregressive). Tests substitute oracle proposers."""
        return None if self.draft is None else DraftProposer(self.draft, stopwatch)

    # ------------------------------------------------------------------ the loop
    def decode_events(self, prompts: list[list[int]], config: GenerationConfig):
        """Yields (row, newly committed tokens, final result or None) as decoding goes."""
        config.validate()
        require(len(prompts) > 0, "no prompts given")
        require(all(len(p) > 0 for p in prompts), "empty prompt: give at least one token")
        block = self.block_size(config)
        longest = max(len(p) for p in prompts)
        require(longest + config.max_new_tokens + block <= self.target.max_positions,
                f"prompt of {longest} tokens + max_new_tokens {config.max_new_tokens} exceeds the target's "
                f"context limit of {self.target.max_positions} tokens")
        device = self.target.device
        generator = torch.Generator(device=device).manual_seed(config.seed)
        watch = Stopwatch(device)
        stop_ids = frozenset(config.stop_token_ids)
        stats = [SequenceStats(block_size=block) for _ in prompts]
        outputs: list[list[int]] = [[] for _ in prompts]
        clock = time.perf_counter()

        # Prefill: the prompt goes into the target cache; its last logits give the first anchor.
        with watch("prefill"):
            logits, features = self.target.prefill(prompts)
            anchors = self._pick(logits[:, -1:], config, generator)[:, 0]           # [b]
        proposer = self.new_proposer(watch)
        if proposer is not None:
            proposer.start(features, self.target.mask)
        active = list(range(len(prompts)))  # batch row -> prompt index
        prefill_seconds = time.perf_counter() - clock

        committed = [[int(t)] for t in anchors]
        while True:
            # Commit this round's tokens, honouring stop tokens and max_new_tokens mid-block.
            finished_rows = []
            for row, prompt_index in enumerate(active):
                tokens, done = self._truncate(committed[row], outputs[prompt_index], config, stop_ids)
                outputs[prompt_index].extend(tokens)
                if stats[prompt_index].cycles:  # the prefill's token is not a verification pass
                    stats[prompt_index].committed_per_cycle.append(len(tokens))
                if done:
                    finished_rows.append(row)
                    result = self._finish(stats[prompt_index], outputs[prompt_index], done, watch,
                                          clock, prefill_seconds)
                    yield prompt_index, tokens, result
                else:
                    yield prompt_index, tokens, None
            if finished_rows:
                keep = [r for r in range(len(active)) if r not in finished_rows]
                if not keep:
                    break
                rows = torch.tensor(keep, device=device)
                active = [active[r] for r in keep]
                anchors = anchors[rows]
                self.target.select_rows(rows)
                if proposer is not None:
                    proposer.select_rows(rows)

            # One cycle: draft a block, verify it in one target pass, accept the longest prefix.
            start = self.target.next_position.clone()       # position of each row's anchor
            if proposer is None:
                drafts, q = anchors.new_zeros(len(active), 0), None
            else:
                proposal = proposer.propose(anchors, start, block, config.temperature, generator)
                drafts, q = proposal.tokens, proposal.q
            with watch("verify"):
                logits, features = self.target.step(torch.cat([anchors[:, None], drafts], dim=1))
            with watch("accept"):
                accepted, bonus = self._accept(drafts, logits, q, config, generator)
                counts = accepted + 1                           # anchor + accepted drafts enter the cache
                self.target.keep(counts, block)
                if proposer is not None:
                    proposer.append(features, counts, start)
            # One host copy per tensor, not one per row.
            accepted_list, drafts_list, bonus_list = accepted.tolist(), drafts.tolist(), bonus.tolist()
            for row, prompt_index in enumerate(active):
                n = accepted_list[row]
                stats[prompt_index].cycles += 1
                for k in range(n):
                    stats[prompt_index].accepted_at_position[k] += 1
                committed[row] = drafts_list[row][:n] + [bonus_list[row]]
            anchors = bonus

    # ------------------------------------------------------------------ pieces of a cycle
    def _pick(self, logits: torch.Tensor, config: GenerationConfig, generator) -> torch.Tensor:
        """Target token(s) from logits [b, q, V]: argmax, or a sample from the processed p."""
        if config.temperature <= 0:
            return logits.argmax(dim=-1)
        p = target_probs(logits, config.temperature, config.top_k, config.top_p)
        return torch.multinomial(p.view(-1, p.shape[-1]), 1, generator=generator).view(p.shape[:-1])

    def _accept(self, drafts, logits, q, config, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """drafts [b, T], target logits [b, T+1, V] -> (accepted count [b], next token [b])."""
        rows = torch.arange(drafts.shape[0], device=drafts.device)
        if config.temperature <= 0:
            target_argmax = logits.argmax(dim=-1)
            accepted = greedy_accept(drafts, target_argmax)
            return accepted, target_argmax[rows, accepted]
        p = target_probs(logits, config.temperature, config.top_k, config.top_p)
        if drafts.shape[1] == 0:
            return torch.zeros_like(rows), torch.multinomial(p[:, 0], 1, generator=generator)[:, 0]
        if q is None:  # a deterministic draft is the special case q = one-hot
            q = torch.zeros_like(p[:, :-1]).scatter_(-1, drafts.unsqueeze(-1), 1.0)
        return sample_accept(drafts, p, q, generator)

    @staticmethod
    def _truncate(tokens: list[int], so_far: list[int], config: GenerationConfig, stop_ids: frozenset):
        """Cut a cycle's tokens at the first stop token (kept) or at max_new_tokens."""
        room = config.max_new_tokens - len(so_far)
        for i, token in enumerate(tokens[:room]):
            if token in stop_ids:
                return tokens[: i + 1], "stop"
        if len(tokens) >= room:
            return tokens[:room], "length"
        return tokens, None

    @staticmethod
    def _finish(stats: SequenceStats, output: list[int], reason: str, watch: Stopwatch, clock: float,
                prefill_seconds: float) -> GenerationResult:
        stats.new_tokens = len(output)
        stats.total_seconds = time.perf_counter() - clock
        stats.prefill_seconds = prefill_seconds
        stats.phase_seconds = watch.snapshot()
        return GenerationResult(list(output), reason, stats)

