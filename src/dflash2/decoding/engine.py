"""The speculative decoding loop (docs/spec.md §3), readable top to bottom.

Contract:
- `SpeculativeDecoder(target, draft=None, speculate="auto")`: `target` is a `TargetAdapter`; with
  `draft=None` (or `speculate="never"`) the same loop decodes autoregressively, one target step
  per token: the honest baseline. `speculate` is a `policy.SPECULATE_MODES` value: `auto` verifies
  only as many draft tokens as pay for themselves and falls back to plain decoding when drafting
  does not pay; `always` verifies the whole block every cycle.
- `session()` -> `DecodeSession`, a running batch: `add(prompts, config)` queues requests, which
  join at the next cycle boundary (their prefill merged into the ragged batch); `cancel(key)`
  drops one at the next boundary; `step()` runs one cycle and returns the `Event`s it produced.
  Every row keeps its own sampling settings, seed, stop tokens and length limit, and its own
  acceptance (rows that accept more advance more; the caches are re-aligned, never truncated to the
  slowest row). Stop tokens and `max_new_tokens` are honoured exactly, even mid-block.
- `generate(prompts, config)` decodes a batch and returns one `GenerationResult` per prompt;
  `stream(prompt, config)` yields the tokens committed by each cycle; `decode_events(prompts,
  config)` yields the `Event`s of a batch as decoding goes.
- Greedy output equals the target's greedy output token for token; sampled output follows the
  target's processed distribution exactly (see `acceptance.py`), in every mode and for any number
  of verified drafts. A row's random numbers depend only on its seed (`dflash2.rng`).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from dflash2.decoding.acceptance import greedy_accept, sample_accept, target_probs
from dflash2.decoding.context import check_context, effective_block_size
from dflash2.decoding.policy import SpeculationPolicy
from dflash2.decoding.proposer import DraftProposer
from dflash2.decoding.sampling import RowSampling
from dflash2.decoding.stats import BatchTiming, Commit, RowStats
from dflash2.decoding.verifier import TargetAdapter
from dflash2.decoding.timing import Stopwatch
from dflash2.errors import require
from dflash2.model.draft import DFlash2DraftModel
from dflash2.rng import ACCEPT, TOKEN, row_seed, sample_from, uniforms


DRAFT_PHASES = ("draft", "draft_head", "selector")  # the draft pass: backbone, LM head, path selector


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
        require(isinstance(self.temperature, (int, float)) and self.temperature >= 0
                and self.temperature != float("inf"), f"temperature must be a finite number >= 0, got {self.temperature!r}")
        require(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        require(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k!r}")
        require(self.block_size is None or (isinstance(self.block_size, int) and self.block_size >= 2),
                f"block_size must be an integer >= 2, got {self.block_size!r}")
        require(isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")


@dataclass
class GenerationResult:
    tokens: list[int]
    finish_reason: str      # "stop" or "length"
    stats: RowStats
    timing: BatchTiming


@dataclass
class Event:
    """What one cycle did for one request: `commit.tokens` were committed (the first
    `commit.accepted` of them accepted draft tokens); `result` is set when the request finished."""
    key: int
    commit: Commit
    result: GenerationResult | None = None

    @property
    def tokens(self) -> list[int]:
        return self.commit.tokens


@dataclass
class _Row:
    key: int
    config: GenerationConfig
    stop_ids: frozenset
    stats: RowStats
    output: list[int] = field(default_factory=list)


class SpeculativeDecoder:
    def __init__(self, target: TargetAdapter, draft: DFlash2DraftModel | None = None, speculate: str = "auto"):
        self.target = target
        self.draft = draft
        if draft is not None:
            draft.config.validate_against_target(target.model.config)
            require(target.target_layer_ids == draft.config.target_layer_ids,
                    "target adapter taps different layers than the draft's target_layer_ids")
            draft.bind_target(target.embed_weight(), target.lm_head_weight())
        self.policy = SpeculationPolicy(speculate if draft is not None or self.custom_proposer else "never")

    custom_proposer = False  # test decoders that bring their own proposer set this

    @property
    def speculate(self) -> str:
        return self.policy.mode

    # ------------------------------------------------------------------ public API
    def session(self) -> "DecodeSession":
        return DecodeSession(self)

    def decode_events(self, prompts: list[list[int]], config: GenerationConfig) -> Iterator[Event]:
        session = self.session()
        session.add(prompts, config)
        while session:
            yield from session.step()

    def generate(self, prompts: list[list[int]], config: GenerationConfig) -> list[GenerationResult]:
        results: dict[int, GenerationResult] = {}
        session = self.session()
        keys = session.add(prompts, config)
        while session:
            for event in session.step():
                if event.result is not None:
                    results[event.key] = event.result
        for result in results.values():  # every row reports its whole batch's timing
            result.timing = session.timing
        return [results[k] for k in keys]

    def stream(self, prompt: list[int], config: GenerationConfig) -> Iterator[list[int]]:
        for event in self.decode_events([prompt], config):
            if event.tokens:
                yield event.tokens

    def check(self, prompts: list[list[int]], config: GenerationConfig) -> None:
        """Raise `DFlash2Error` (one line) unless `prompts` with `config` can be decoded: a valid
        config, non-empty prompts, and prompt + max_new_tokens + block size within the context.
        `DecodeSession.add` runs it; it reads no decoding state, so any thread may call it."""
        config.validate()
        require(len(prompts) > 0, "no prompts given")
        require(all(len(p) > 0 for p in prompts), "empty prompt: give at least one token")
        check_context(max(len(p) for p in prompts), config.max_new_tokens, self.block_size(config),
                      self.target.max_positions)

    def block_size(self, config: GenerationConfig) -> int:
        return effective_block_size(None if self.draft is None else self.draft.config.block_size, config.block_size)

    def new_proposer(self, stopwatch: Stopwatch) -> DraftProposer | None:
        """The draft side of the cycle (None: autoregressive). Tests substitute oracle proposers."""
        return None if self.draft is None else DraftProposer(self.draft, stopwatch)


class DecodeSession:
    """A running batch of requests; see the module docstring."""

    def __init__(self, decoder: SpeculativeDecoder):
        self.decoder, self.target, self.policy = decoder, decoder.target, decoder.policy
        self.watch = Stopwatch(self.target.device)
        self.timing = BatchTiming()
        self.proposer = decoder.new_proposer(self.watch) if self.policy.mode != "never" else None
        self.rows: list[_Row] = []
        self.anchors: torch.Tensor | None = None          # [b] last committed token, not yet in the target cache
        self.sampling: RowSampling | None = None
        self.block = 1
        self._pending: list[tuple[int, list[int], GenerationConfig]] = []
        self._cancelled: set[int] = set()
        self._keys = itertools.count()
        self._clock = time.perf_counter()

    def __bool__(self) -> bool:
        return bool(self.rows or self._pending)

    def add(self, prompts: list[list[int]], config: GenerationConfig) -> list[int]:
        """Queue prompts (one row each, sharing `config`); returns their keys. A row of a sampled
        request seeded s uses seed `row_seed(s, i)`, i its index in `prompts`."""
        self.decoder.check(prompts, config)
        keys = []
        for index, prompt in enumerate(prompts):
            key = next(self._keys)
            row_config = GenerationConfig(**{**config.__dict__, "seed": row_seed(config.seed, index)})
            self._pending.append((key, list(prompt), row_config))
            keys.append(key)
        return keys

    def cancel(self, key: int) -> None:
        self._cancelled.add(key)

    def discard(self) -> None:
        """Drop every row and the batch state behind them (the target's cache), e.g. after a
        failed step; the decoder's next session starts clean."""
        self.rows, self._pending, self.anchors, self.sampling = [], [], None, None
        self.target.reset()

    # ------------------------------------------------------------------ one step
    def step(self) -> list[Event]:
        self._drop_cancelled()
        events = self._admit()
        if self.rows:
            events += self._cycle()
        if not self.rows and not self._pending:
            self.target.reset()
        return events

    def _admit(self) -> list[Event]:
        """Prefill the queued requests and merge them into the batch; their first token commits."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        block = max(self.decoder.block_size(c) for _, _, c in pending)
        if self.policy.mode == "auto" and not self.policy.costs.calibrated and block > 1:
            self.policy.costs.calibrate(self.target, block)      # once per decoder, not counted as decoding time
            self._clock = time.perf_counter() if not self.rows else self._clock
        with self.watch("prefill"):
            clock = time.perf_counter()
            logits, features, mask = self.target.add_rows([prompt for _, prompt, _ in pending])
            sampling = RowSampling.stack([(c.temperature, c.top_k, c.top_p, c.seed) for _, _, c in pending],
                                         self.target.device)
            positions = self.target.next_position[-len(pending):]                       # [n] first new position
            first = self._pick(logits[:, -1], sampling, positions)                       # [n]
            if self.proposer is not None:
                self.proposer.add_rows(features, mask)
            self.timing.prefill_seconds += time.perf_counter() - clock
        self.anchors = first if self.anchors is None else torch.cat([self.anchors, first])
        self.sampling = sampling if self.sampling is None else self.sampling.cat(sampling)
        new_rows = [_Row(key, config, frozenset(config.stop_token_ids), RowStats(self.decoder.block_size(config)))
                    for key, _, config in pending]
        self.rows += new_rows
        self.block = max(self.decoder.block_size(r.config) for r in self.rows)
        return self._commit(new_rows, [Commit([int(t)]) for t in first.tolist()], first_token=True)

    def _cycle(self) -> list[Event]:
        """Draft a block, verify it in one target pass, accept the longest correct prefix."""
        b, clock, cpu = len(self.rows), time.perf_counter(), time.process_time()
        start = self.target.next_position.clone()                  # each row's anchor position
        plan = self.policy.plan(b)
        drafts = self.anchors.new_zeros(b, 0)
        q = confidence = draft_seconds = None
        verified = [0] * b
        if plan.draft and self.block > 1:
            before = sum(self.watch.totals[p] for p in DRAFT_PHASES)
            proposal = self.proposer.propose(self.anchors, start, self.block, self.sampling.temperature,
                                             self.sampling.seed)
            draft_seconds = sum(self.watch.totals[p] for p in DRAFT_PHASES) - before
            self.policy.drafted(b, draft_seconds)
            confidence = (proposal.confidence.tolist() if proposal.confidence is not None
                          else [[1.0] * proposal.tokens.shape[1]] * b)
            greedy = self.sampling.greedy.tolist()
            with self.watch("policy"):
                length = self.policy.choose_length(b, confidence, greedy, self.block, plan.probe)
            drafts, q = proposal.tokens[:, :length], None if proposal.q is None else proposal.q[:, :length]
            verified = [min(length, self.decoder.block_size(r.config) - 1) for r in self.rows]
        with self.watch("verify"):
            verify_clock = time.perf_counter()
            logits, features = self.target.step(torch.cat([self.anchors[:, None], drafts], dim=1))
            verify_seconds = time.perf_counter() - verify_clock
        with self.watch("accept"):
            limits = torch.tensor(verified, dtype=torch.long, device=drafts.device)
            accepted, bonus = self._accept(drafts, logits, q, limits, start)
            counts = accepted + 1                                  # anchor + accepted drafts enter the cache
        with self.watch("realign"):                                # roll back rejected slots, re-align rows
            self.target.keep(counts, drafts.shape[1] + 1)
            if self.proposer is not None:
                self.proposer.append(features, counts, start, defer=draft_seconds is None)
        with self.watch("host"):                                   # one host copy per tensor, not per row
            accepted_list, drafts_list, bonus_list = accepted.tolist(), drafts.tolist(), bonus.tolist()
            commits = [Commit(drafts_list[r][:n] + [bonus_list[r]], accepted=n) for r, n in enumerate(accepted_list)]
        self.anchors = bonus
        seconds = time.perf_counter() - clock
        host = seconds - verify_seconds - (draft_seconds or 0.0)
        with self.watch("policy"):
            self.policy.observe(b, drafts.shape[1] + 1, confidence, self.sampling.greedy.tolist(), verified,
                                accepted_list, draft_seconds, verify_seconds, host, plan.probe)
        if draft_seconds is None:
            self.timing.plain_steps += 1
            self.timing.plain_seconds += seconds
            self.timing.plain_tokens += b
        else:
            self.timing.speculative_cycles += 1
        self.timing.cycle_cpu_seconds += time.process_time() - cpu
        with self.watch("host"):
            return self._commit(self.rows, commits, verified=verified)

    # ------------------------------------------------------------------ pieces of a cycle
    def _pick(self, logits: torch.Tensor, sampling: RowSampling, positions: torch.Tensor) -> torch.Tensor:
        """One target token per row from logits [n, V]: argmax, or a sample from the processed p."""
        argmax = logits.argmax(dim=-1)
        if sampling.all_greedy:
            return argmax
        p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        return torch.where(sampling.greedy, argmax, sample_from(p, uniforms(sampling.seed, positions, TOKEN)))

    def _accept(self, drafts, logits, q, limits, start) -> tuple[torch.Tensor, torch.Tensor]:
        """drafts [b, T], target logits [b, T+1, V] -> (accepted count [b], next token [b])."""
        rows = torch.arange(drafts.shape[0], device=drafts.device)
        target_argmax = logits.argmax(dim=-1)
        accepted = greedy_accept(drafts, target_argmax, limits)
        bonus = target_argmax[rows, accepted]
        s = self.sampling
        if s.all_greedy:
            return accepted, bonus
        p = target_probs(logits, s.temperature, s.top_k, s.top_p)
        if q is None:  # a deterministic draft is the special case q = one-hot
            q = torch.zeros_like(p[:, :-1]).scatter_(-1, drafts.unsqueeze(-1), 1.0)
        decided = start[:, None] + 1 + torch.arange(drafts.shape[1] + 1, device=drafts.device)  # [b, T+1]
        sampled, token = sample_accept(drafts, p, q, uniforms(s.seed, decided[:, :-1], ACCEPT),
                                       uniforms(s.seed, decided, TOKEN), limits)
        return torch.where(s.greedy, accepted, sampled), torch.where(s.greedy, bonus, token)

    def _commit(self, rows: list[_Row], commits: list[Commit], verified: list[int] | None = None,
                first_token: bool = False) -> list[Event]:
        """Add each row's tokens (cut at a stop token or max_new_tokens), record its statistics,
        and retire the rows that finished."""
        events, finished = [], []
        for index, (row, commit) in enumerate(zip(rows, commits)):
            tokens, reason = _truncate(commit.tokens, row.output, row.config, row.stop_ids)
            commit = Commit(tokens, min(commit.accepted, len(tokens)), 0 if first_token else verified[index])
            row.output += tokens
            if not first_token:  # the prefill's token is not a verification pass
                row.stats.record_cycle(verified[index], len(tokens), commit.accepted)
            result = None
            if reason is not None:
                row.stats.new_tokens = len(row.output)
                self.timing.total_seconds = time.perf_counter() - self._clock
                self.timing.phase_seconds = self.watch.snapshot()
                result = GenerationResult(list(row.output), reason, row.stats, _copy(self.timing))
                finished.append(row)
            events.append(Event(row.key, commit, result))
        self._retire(set(id(r) for r in finished))
        return events

    def _retire(self, gone: set[int]) -> None:
        if not gone:
            return
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.anchors = self.sampling = None
            self.target.reset()
            self.proposer = self.decoder.new_proposer(self.watch) if self.proposer is not None else None
            return
        index = torch.tensor(keep, device=self.target.device)
        self.anchors, self.sampling = self.anchors[index], self.sampling.select(index)
        self.target.select_rows(index)
        if self.proposer is not None:
            self.proposer.select_rows(index)

    def _drop_cancelled(self) -> None:
        """Cancelled requests leave silently: queued ones never start, running rows are retired."""
        if not self._cancelled:
            return
        self._pending = [p for p in self._pending if p[0] not in self._cancelled]
        self._retire({id(r) for r in self.rows if r.key in self._cancelled})
        self._cancelled.clear()


def _truncate(tokens: list[int], so_far: list[int], config: GenerationConfig, stop_ids: frozenset):
    """Cut a cycle's tokens at the first stop token (kept) or at max_new_tokens."""
    room = config.max_new_tokens - len(so_far)
    for i, token in enumerate(tokens[:room]):
        if token in stop_ids:
            return tokens[: i + 1], "stop"
    if len(tokens) >= room:
        return tokens[:room], "length"
    return tokens, None


def _copy(timing: BatchTiming) -> BatchTiming:
    return BatchTiming(**{**timing.__dict__, "phase_seconds": dict(timing.phase_seconds)})
