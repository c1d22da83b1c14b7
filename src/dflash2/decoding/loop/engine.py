"""The speculative decoding loop (docs/spec.md §3), readable top to bottom.

Contract:
- `SpeculativeDecoder(target, draft=None, speculate="auto", proposer=None, suffix_store=None,
  lattice=False, drafter=None)`: `target` is a `TargetAdapter`; `proposer` is one of
  `proposers.kinds.PROPOSERS` (`draft`, `lookup`, `hybrid`, `mtp`; None: the draft's own, or none),
  `draft` a DFlash2 draft or an `MtpHead`, `suffix_store` lookup's store shared between requests.
  `hybrid` lets each row verify the source the policy expects to commit more, or, for greedy rows
  on attention-only targets, both as one token tree (`proposers.tree`); with `lattice` a draft's
  selector also offers its second path as a tree's branch. `drafter` (a `proposers.draft.Drafter`)
  replaces the draft's own proposer (e.g. an oracle). `speculate` (`policy.SPECULATE_MODES`): `auto`
  verifies only what pays for itself and falls back to plain decoding while the draft does not;
  `always` verifies the whole block every cycle; `never` (or no proposer) decodes one target step
  per token, the honest baseline.
- `variant(proposer=None, speculate=None)`: a sibling decoder over the same target and draft with a
  policy that has learnt nothing of the proposers (sharing the cost model when the proposer is the
  same). Sessions over one target take turns: a session refuses rows while another's batch holds it.
- `session(fixed=False)` -> `DecodeSession`, a running batch: `add(prompts, config)` queues requests,
  which join at the next cycle boundary (their prefill merged into the ragged batch); `cancel(key)`
  drops one at the next boundary; `step()` runs one cycle and returns its `Event`s. `fixed`
  (`generate`, `decode_events`): no request joins once it runs, so the policy minimises the time
  until its last row ends, not the tokens/s of a batch that refills. Every row keeps its own
  sampling settings, seed, stop tokens, length limit and acceptance (caches re-aligned, never
  truncated to the slowest row); stop tokens and `max_new_tokens` hold exactly, even mid-block.
- `generate(prompts, config)` -> one `GenerationResult` per prompt; `stream(prompt, config)` yields
  each cycle's tokens; `decode_events(prompts, config)` yields a batch's `Event`s as decoding goes.
- Greedy output equals the target's token for token; sampled output follows the target's processed
  distribution exactly (`acceptance.py`; a lookup token is a point-mass draft), in every mode, for
  every proposer and any number of verified tokens. A row's random numbers depend only on its seed.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Iterator

import torch

from dflash2.decoding.loop.acceptance import greedy_accept, sample_accept, target_probs
from dflash2.decoding.loop.block import VerifyBlock, assemble
from dflash2.decoding.loop.context import check_context
from dflash2.decoding.loop.following import cycle_following, prompt_following
from dflash2.decoding.proposers.lookup import Lookup, LookupProposer, SuffixStore
from dflash2.decoding.policy.cycle import CycleRecord, Offer
from dflash2.decoding.policy import SpeculationPolicy
from dflash2.decoding.proposers.draft import Drafter, Proposal
from dflash2.decoding.proposers import kinds
from dflash2.decoding.loop.requests import Event, GenerationConfig, GenerationResult
from dflash2.decoding.loop.sampling import RowSampling
from dflash2.decoding.loop.stats import BatchTiming, Commit, RowStats
from dflash2.decoding.loop.timing import CycleTimer, Stopwatch
from dflash2.decoding.proposers.tree import kept_nodes, path_nodes, tree_greedy_accept
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import require
from dflash2.model.draft import DFlash2DraftModel
from dflash2.model.families import family_of
from dflash2.model.mtp import MtpHead
from dflash2.runtime.rng import ACCEPT, TOKEN, row_seed, sample_from, uniforms


@dataclass
class _Row:
    key: int
    config: GenerationConfig
    stats: RowStats
    output: list[int] = field(default_factory=list)


class SpeculativeDecoder:
    def __init__(self, target: TargetAdapter, draft: DFlash2DraftModel | MtpHead | None = None, speculate: str = "auto",
                 proposer: str | None = None, suffix_store: SuffixStore | None = None, lattice: bool = False,
                 drafter: Drafter | None = None):
        kinds.check_proposer(proposer)
        family = None if draft is None else family_of(draft)
        if proposer is None:
            proposer = kinds.decoder_default(draft is not None or drafter is not None, family or "dflash2")
        require(proposer not in kinds.DRAFT_PROPOSERS or draft is not None or drafter is not None,
                f"proposer '{proposer}' needs a draft (proposer 'lookup' needs none)")
        kinds.check_family(proposer, family)
        self.target = target
        self.draft = draft if proposer in kinds.DRAFT_PROPOSERS else None
        self.proposer = proposer
        self.suffix_store = suffix_store
        self.lattice = lattice
        if self.draft is not None:
            draft.config.validate_against_target(target.model.config)
            require(target.target_layer_ids == draft.config.target_layer_ids,
                    "target adapter taps different layers than the draft's target_layer_ids")
            draft.bind_target(target.embed_weight(), target.lm_head_weight())
            drafter = drafter or kinds.drafter_for(draft, target, lattice)
        self.drafter = drafter if proposer in kinds.DRAFT_PROPOSERS else None
        self.policy = SpeculationPolicy(speculate if proposer is not None else "never",
                                        sources=2 if proposer == "hybrid" else 1)

    @property
    def speculate(self) -> str:
        return self.policy.mode

    def variant(self, proposer: str | None = None, speculate: str | None = None) -> "SpeculativeDecoder":
        """A sibling over the same target; see the module docstring."""
        kinds.check_proposer(proposer)
        speculate, proposer = speculate or self.speculate, proposer or self.proposer
        if speculate == "never":
            return type(self)(self.target)
        require(proposer not in kinds.DRAFT_PROPOSERS or self.drafter is not None,
                f"proposer '{proposer}' needs a draft, and this decoder has none (its proposer is '{self.proposer}')")
        sibling = type(self)(self.target, self.draft, speculate, proposer, self.suffix_store, self.lattice, self.drafter)
        if proposer == self.proposer and speculate == self.speculate:
            sibling.policy = self.policy.fresh()
        return sibling

    # ------------------------------------------------------------------ public API
    def session(self, fixed: bool = False) -> "DecodeSession":
        return DecodeSession(self, fixed)

    def decode_events(self, prompts: list[list[int]], config: GenerationConfig) -> Iterator[Event]:
        session = self.session(fixed=True)
        session.add(prompts, config)
        while session:
            yield from session.step()

    def generate(self, prompts: list[list[int]], config: GenerationConfig) -> list[GenerationResult]:
        session, results = self.session(fixed=True), {}
        keys = session.add(prompts, config)
        while session:
            results.update((event.key, event.result) for event in session.step() if event.result is not None)
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
        proposer = None if self.policy.mode == "never" else self.proposer
        return kinds.block_size(proposer, None if self.drafter is None else self.drafter.block_size, config.block_size)

    def new_proposer(self, stopwatch: Stopwatch):
        """The draft side of the cycle (None: no draft)."""
        return None if self.drafter is None else self.drafter.new(stopwatch)


class DecodeSession:
    """A running batch of requests; see the module docstring."""

    def __init__(self, decoder: SpeculativeDecoder, fixed: bool = False):
        self.decoder, self.target, self.policy = decoder, decoder.target, decoder.policy
        self.fixed = fixed
        self.watch = Stopwatch(self.target.device)
        self.timing = BatchTiming()
        speculating = self.policy.mode != "never"
        self.proposer = decoder.new_proposer(self.watch) if speculating else None
        self.lookup = LookupProposer(store=decoder.suffix_store) if speculating and decoder.proposer in (
            "lookup", "hybrid") else None
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
        require(not (self.fixed and self.rows), "a fixed batch takes no requests once it runs")
        keys = [next(self._keys) for _ in prompts]
        self._pending += [(key, list(prompt), replace(config, seed=row_seed(config.seed, index)))
                          for index, (key, prompt) in enumerate(zip(keys, prompts))]
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
        self.target.claim(self)
        pending, self._pending = self._pending, []
        block = max(self.decoder.block_size(c) for _, _, c in pending)
        if self.policy.calibrate(self.target, block) and not self.rows:   # once per cost model, not counted
            self._clock = time.perf_counter()
        with self.watch("prefill"):
            clock = time.perf_counter()
            logits, features, mask = self.target.add_rows([prompt for _, prompt, _ in pending])
            sampling = RowSampling.stack([(c.temperature, c.top_k, c.top_p, c.seed) for _, _, c in pending],
                                         self.target.device)
            positions = self.target.next_position[-len(pending):]                       # [n] first new position
            first = self._pick(logits[:, -1], sampling, positions)                       # [n]
            if self.proposer is not None:
                self.proposer.add_rows(features, mask,
                                       following=prompt_following([p for _, p, _ in pending], first, mask.shape[1]))
            if self.lookup is not None:
                self.lookup.add_rows([prompt + [token] for (_, prompt, _), token in zip(pending, first.tolist())])
            self.timing.prefill_seconds += time.perf_counter() - clock
        self.anchors = first if self.anchors is None else torch.cat([self.anchors, first])
        self.sampling = sampling if self.sampling is None else self.sampling.cat(sampling)
        new_rows = [_Row(key, config, RowStats(self.decoder.block_size(config))) for key, _, config in pending]
        self.rows += new_rows
        self.block = max(self.decoder.block_size(r.config) for r in self.rows)
        return self._commit(new_rows, [Commit([int(t)]) for t in first.tolist()], first_token=True)

    def _cycle(self) -> list[Event]:
        """One round: propose -> choose -> verify -> accept -> keep -> commit and observe."""
        b, timer = len(self.rows), CycleTimer(self.watch)
        start = self.target.next_position.clone()                  # [b] each row's anchor position
        # 1. propose: lookup's tokens, then the draft's block if the plan runs its pass
        lookups, offer = self._look_up()
        plan = self.policy.prepare(b, offer, self.block, can_draft=self.proposer is not None)
        proposal = None
        if plan.draft:
            with timer("draft"):
                proposal = self.proposer.propose(self.anchors, start, self.block, self.sampling.temperature,
                                                 self.sampling.seed)
            offer = self._with_draft(offer, proposal, lookups)
        # 2. choose what each row verifies, and verify every row's block in one target pass
        with self.watch("policy"):
            choice = plan.choose(offer, timer.seconds["draft"])
        block = assemble(choice, self.anchors, [self.decoder.block_size(row.config) - 1 for row in self.rows],
                         proposal, lookups)
        with timer("verify", phase="verify"):
            logits, features = self.target.verify(block.ids, block.tree)
        # 3. accept each row's longest correct prefix and keep it in the caches (the draft's too)
        with self.watch("accept"):
            accepted, bonus, branch, per_branch = self._accept(block, logits, start)
        with self.watch("realign"):                                # roll back rejected slots, re-align rows
            features, path = self._keep(block, accepted, branch, features)
            if self.proposer is not None:
                self.proposer.append(features, accepted + 1, start, defer=proposal is None,
                                     following=cycle_following(path, accepted, bonus))
        # 4. commit each row's tokens, and let the policy learn from what the cycle did
        with self.watch("host"):                                   # one host copy per tensor, not per row
            accepted_list, bonus_list = accepted.tolist(), bonus.tolist()
            branch_list = [0] * b if branch is None else branch.tolist()
            commits = [block.commit(r, n, branch_list[r], bonus_list[r]) for r, n in enumerate(accepted_list)]
            if self.lookup is not None:
                self.lookup.extend([c.tokens for c in commits])
        self.anchors = bonus
        draft_s, verify_s = timer.seconds["draft"], timer.seconds["verify"]
        record = CycleRecord(b, offer, plan, choice, proposal is not None, block.verified, accepted_list, block.width,
                             draft_s, verify_s, timer.wall() - draft_s - verify_s, block.branch_accepted(per_branch))
        with self.watch("policy"):
            self.policy.observe(record)
        self.timing.record_cycle(b, record.drafted, record.width, timer.wall(), timer.cpu())
        with self.watch("host"):
            return self._commit(self.rows, commits)

    # ------------------------------------------------------------------ pieces of a cycle
    def _look_up(self) -> tuple[list[Lookup] | None, Offer]:
        """Each row's lookup proposal (None without a lookup proposer) and the offer it makes."""
        greedy = self.sampling.greedy.tolist()
        remaining = [r.config.max_new_tokens - len(r.output) for r in self.rows] if self.fixed else None
        if self.lookup is None or self.block < 2:
            return None, Offer(greedy, remaining=remaining)
        with self.watch("lookup"):
            lookups = self.lookup.propose(self.block - 1)
        return lookups, Offer.of(greedy, lookup=[found.confidence for found in lookups], remaining=remaining)

    def _with_draft(self, offer: Offer, proposal: Proposal, lookups: list[Lookup] | None) -> Offer:
        """The offer once the draft has proposed: its confidence (1.0 where it gives none) and, on targets
        that verify trees, what its tokens share at their start with lookup's and its second path."""
        tokens, trees = proposal.tokens.tolist(), self.target.supports_trees
        confidence = [[1.0] * len(t) for t in tokens] if proposal.confidence is None else proposal.confidence.tolist()
        shared = None if lookups is None or not trees else [
            _common_start(t, found.tokens) if found.tokens else None for t, found in zip(tokens, lookups)]
        second = proposal.second if trees else None
        return Offer.of(offer.greedy, confidence, offer.lookup, shared, offer.remaining,
                        None if second is None else second.confidence.tolist(),
                        None if second is None else second.fork.tolist())

    def _keep(self, block: VerifyBlock, accepted: torch.Tensor, branch: torch.Tensor | None,
              features: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Keep each row's anchor and accepted tokens in the target's cache (a tree: its winning path,
        the rest holed out) and return their features in order and the verified path's ids [b, L + 1]."""
        if block.tree is None:
            self.target.keep(accepted + 1, block.width)
            return features, block.ids
        self.target.keep_nodes(kept_nodes(block.tree, branch, accepted))
        nodes = path_nodes(block.tree, branch)                                                  # [b, L + 1]
        if features is not None:
            features = features.gather(1, nodes[:, :, None].expand(-1, -1, features.shape[-1]))   # [b, L + 1, H]
        return features, block.ids.gather(1, nodes)

    def _pick(self, logits: torch.Tensor, sampling: RowSampling, positions: torch.Tensor) -> torch.Tensor:
        """One target token per row from logits [n, V]: argmax, or a sample from the processed p."""
        argmax = logits.argmax(dim=-1)
        if sampling.all_greedy:
            return argmax
        p = target_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        return torch.where(sampling.greedy, argmax, sample_from(p, uniforms(sampling.seed, positions, TOKEN)))

    def _accept(self, block: VerifyBlock, logits: torch.Tensor, start: torch.Tensor):
        """logits [b, W, V] -> (accepted [b], next token [b], winning branch [b] or None, accepted per
        branch [b, n] or None). Greedy rows of a tree take `tree_greedy_accept`; every other row
        verifies the linear path at nodes 1..limit."""
        drafts, limits = block.ids[:, 1:], block.limits
        target_argmax = logits.argmax(dim=-1)                                              # [b, W]
        if block.tree is None:
            accepted = greedy_accept(drafts, target_argmax, limits)
            bonus, branch, per_branch = target_argmax.gather(1, accepted[:, None])[:, 0], None, None
        else:
            outcome = tree_greedy_accept(block.tree, target_argmax)
            accepted, bonus, branch, per_branch = outcome.accepted, outcome.bonus, outcome.branch, outcome.per_branch
        s = self.sampling
        if s.all_greedy:
            return accepted, bonus, branch, per_branch
        p = target_probs(logits, s.temperature, s.top_k, s.top_p)
        q = block.q if block.q is not None else torch.zeros_like(p[:, :-1]).scatter_(-1, drafts.unsqueeze(-1), 1.0)
        decided = start[:, None] + 1 + torch.arange(drafts.shape[1] + 1, device=drafts.device)  # [b, W]
        sampled, token = sample_accept(drafts, p, q, uniforms(s.seed, decided[:, :-1], ACCEPT),
                                       uniforms(s.seed, decided, TOKEN), limits)
        if branch is not None:   # sampled rows verify one branch, the first
            branch = torch.where(s.greedy, branch, torch.zeros_like(branch))
        return torch.where(s.greedy, accepted, sampled), torch.where(s.greedy, bonus, token), branch, per_branch

    def _commit(self, rows: list[_Row], commits: list[Commit], first_token: bool = False) -> list[Event]:
        """Add each row's tokens (cut at a stop token or max_new_tokens), record its statistics,
        and retire the rows that finished."""
        events, finished = [], []
        for row, commit in zip(rows, commits):
            tokens, reason = _truncate(commit.tokens, row.config.max_new_tokens - len(row.output),
                                       row.config.stop_token_ids)
            commit = replace(commit, tokens=tokens, accepted=min(commit.accepted, len(tokens)))
            row.output += tokens
            if not first_token:  # the prefill's token is not a verification pass
                row.stats.record_cycle(commit.drafted, len(tokens), commit.accepted, commit.source, commit.tree_extra)
            result = None
            if reason is not None:
                row.stats.new_tokens = len(row.output)
                self.timing.total_seconds = time.perf_counter() - self._clock
                self.timing.phase_seconds = self.watch.snapshot()
                result = GenerationResult(list(row.output), reason, row.stats,
                                          replace(self.timing, phase_seconds=dict(self.timing.phase_seconds)))
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
            if self.lookup is not None:
                self.lookup.select_rows([])                         # their text goes to the shared store
            return
        index = torch.tensor(keep, device=self.target.device)
        self.anchors, self.sampling = self.anchors[index], self.sampling.select(index)
        self.target.select_rows(index)
        if self.proposer is not None:
            self.proposer.select_rows(index)
        if self.lookup is not None:
            self.lookup.select_rows(keep)

    def _drop_cancelled(self) -> None:
        """Cancelled requests leave silently: queued ones never start, running rows are retired."""
        if not self._cancelled:
            return
        self._pending = [p for p in self._pending if p[0] not in self._cancelled]
        self._retire({id(r) for r in self.rows if r.key in self._cancelled})
        self._cancelled.clear()


def _common_start(a: list[int], b: list[int]) -> int:
    return next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _truncate(tokens: list[int], room: int, stop_ids: tuple[int, ...]) -> tuple[list[int], str | None]:
    """Cut a cycle's tokens at the first stop token (kept) or after `room` tokens; why the row ends, if it does."""
    stop = next((i + 1 for i, token in enumerate(tokens[:room]) if token in stop_ids), None)
    if stop is not None:
        return tokens[:stop], "stop"
    return tokens[:room], "length" if len(tokens) >= room else None

