"""Draft side of a decoding cycle: the draft's context cache and one block proposal (docs/spec.md §3 step 1).

Contract:
- `DraftProposer(draft)` packs the draft's projections for inference (`DFlash2DraftModel.pack`:
  the same tokens; at bfloat16 up to 32 rows the same bits) and holds, per draft layer, the K/V of the target features committed so far
  (left-padded like the target cache) plus their positions and validity mask.
- `add_rows(features, mask)` adds the context of newly prefilled rows (the first call starts the
  batch; later rows are merged in, left-padded like the target cache, and come last);
  `append(features, counts, first_position, defer)` adds the features of the tokens committed in
  a cycle (the first counts[r] of the q verified positions; rows that keep fewer leave masked
  holes); `defer` queues them until the draft next runs (plain steps in fallback then cost one
  projection per probe, not one per token); `select_rows(rows)` drops sequences. Both also take
  `following` (`loop.following`: the committed token after each position), which every proposer
  is given and the draft, reading features alone, ignores (an MTP head reads it: `proposers.mtp`).
- `propose(anchors, start_positions, block_size, temperature, seeds)` runs one block
  `[anchor, MASK x (block_size-1)]` at positions start..start+block_size-1 and returns a `Proposal`:
  draft tokens [b, T], the dense distribution q [b, T, V] each was drawn from (None when every row
  is greedy) and the draft's confidence in each token [b, T] (the probability it gave the token).
  `temperature` and `seeds` are per row ([b]); sampled rows draw with `dflash2.runtime.rng` uniforms keyed
  by (seed, position). With a selector the tokens are a path through the top-K candidates; without
  one (DFlash v1) they are per-position argmax / samples of the draft logits.
- A sampled row's tokens are drawn at `temperature_factor` (default `SAMPLED_DRAFT_TEMPERATURE`)
  times the row's temperature: a sharper distribution than the draft's own, which the target's
  acceptance of sampled tokens prefers (measured on the recipe yardstick's T=1, top-p 0.95,
  top-k 20: tau +0.070 and +0.064 with the drafts of steps 300 and 375 of the 2026-12-02 campaign;
  0.5 / 0.85 / 1.3 gave +0.013 / +0.032 / 0.000; BENCHMARKS.md section 3.2). Exactness does not
  depend on it: the returned q is the distribution the tokens were drawn from, which is what the
  acceptance rule divides by. Greedy rows are unaffected.
- `Drafter(block_size, new)`: what a decoder needs of its draft side: the block size it proposes in
  and `new(stopwatch)`, a fresh proposer with this interface per batch; `Drafter.of(draft, lattice)`
  makes `DraftProposer`s of a draft model.
- `lattice=True` (a draft with a selector): the proposal also carries the lattice's second path
  (`CandidateSelector.second_path`: the runner-up where a second branch is likeliest to win, then
  greedy), for greedy rows to verify beside the main path as a token tree; sampled rows ignore it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from dflash2.decoding.loop.acceptance import dense_q
from dflash2.model.draft import DFlash2DraftModel
from dflash2.model.selector import SecondPath
from dflash2.model.mask import block_visibility
from dflash2.decoding.verifier.ragged import compaction_index, worth_compacting
from dflash2.decoding.loop.timing import Stopwatch
from dflash2.runtime.rng import DRAFT, sample_from, uniforms


SAMPLED_DRAFT_TEMPERATURE = 0.7   # see the contract
DRAFT_PHASES = ("draft", "draft_head", "selector")  # the stopwatch phases of one draft pass: backbone, LM head, path selector

@dataclass
class Proposal:
    tokens: torch.Tensor            # [b, T]
    q: torch.Tensor | None          # [b, T, V] (None when every row is greedy)
    confidence: torch.Tensor | None = None   # [b, T] the draft's probability of each token
    second: SecondPath | None = None         # the lattice's second path (target ids), `lattice` only


class DraftProposer:
    def __init__(self, draft: DFlash2DraftModel, stopwatch: Stopwatch | None = None,
                 temperature_factor: float = SAMPLED_DRAFT_TEMPERATURE, lattice: bool = False):
        self.draft = draft
        self.lattice = lattice and draft.selector is not None
        self.temperature_factor = temperature_factor
        self.window = draft.config.sliding_window
        self.stopwatch = stopwatch or Stopwatch(None)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.positions: torch.Tensor | None = None   # [b, S]
        self.valid: torch.Tensor | None = None       # [b, S] bool
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []   # deferred uniform appends
        draft.pack()   # inference copies of the projections (`DFlash2DraftModel.pack`)

    def add_rows(self, features: torch.Tensor, mask: torch.Tensor, following: torch.Tensor | None = None) -> None:
        """features [n, L, F] from a prefill, mask [n, L] (1 = real token); `following` (the committed
        tokens, which an MTP head reads) is not needed: the draft reads features alone."""
        self._flush()
        valid = mask.bool()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            kv = self.draft.context_kv(features, positions)
        if self.positions is None:
            self.kv, self.positions, self.valid = kv, positions, valid
            return
        width = max(self.positions.shape[1], positions.shape[1])

        def slots(x: torch.Tensor) -> torch.Tensor:  # left-pad the slot dim to `width`: [b, S] or [b, kv, S, d]
            return F.pad(x, (width - x.shape[1], 0)) if x.dim() == 2 else F.pad(x, (0, 0, width - x.shape[2], 0))

        self.kv = [(torch.cat([slots(k), slots(nk)]), torch.cat([slots(v), slots(nv)]))
                   for (k, v), (nk, nv) in zip(self.kv, kv)]
        self.positions = torch.cat([slots(self.positions), slots(positions)])
        self.valid = torch.cat([slots(self.valid), slots(valid)])

    def append(self, features: torch.Tensor, counts: torch.Tensor, first_position: torch.Tensor,
               defer: bool = False, following: torch.Tensor | None = None) -> None:
        """features [b, q, F] at positions first_position[r] + 0..q-1; keep the first counts[r].
        Rows that keep fewer slots leave masked-out holes (compacted by one gather when they take
        too much room). `defer` (plain steps, one token a row) only queues the features: they are
        projected together when the draft next runs or the batch changes."""
        top = int(counts.max())
        positions = first_position[:, None] + torch.arange(features.shape[1], device=features.device)   # [b, q]
        if bool((counts == top).all()):  # every row keeps the same count: only the kept slots matter
            self._pending.append((features[:, :top], positions[:, :top]))
            if not defer:
                self._flush()
            return
        self._flush()
        valid = torch.arange(features.shape[1], device=features.device)[None, :] < counts[:, None]
        self._extend(features, positions, valid)
        if worth_compacting(self.valid):
            index = compaction_index(self.valid)                                            # [b, S']
            self.kv = [(_gather_slots(k, index), _gather_slots(v, index)) for k, v in self.kv]
            self.positions, self.valid = self.positions.gather(1, index), self.valid.gather(1, index)

    def _flush(self) -> None:
        """Project the queued features of uniform appends in one pass."""
        if not self._pending:
            return
        features = torch.cat([f for f, _ in self._pending], dim=1)
        positions = torch.cat([p for _, p in self._pending], dim=1)
        self._pending = []
        self._extend(features, positions, torch.ones_like(positions, dtype=torch.bool))

    def _extend(self, features: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> None:
        with torch.inference_mode():
            new_kv = self.draft.context_kv(features, positions)
        self.kv = [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self.kv, new_kv)]
        self.positions = torch.cat([self.positions, positions], dim=1)
        self.valid = torch.cat([self.valid, valid], dim=1)

    def select_rows(self, rows: torch.Tensor) -> None:
        self._flush()
        self.kv = [(k[rows], v[rows]) for k, v in self.kv]
        self.positions, self.valid = self.positions[rows], self.valid[rows]

    def propose(self, anchors: torch.Tensor, start_positions: torch.Tensor, block_size: int,
                temperature: torch.Tensor | float = 0.0, seeds: torch.Tensor | None = None) -> Proposal:
        self._flush()
        draft = self.draft
        b = anchors.shape[0]
        temperature = torch.as_tensor(temperature, dtype=torch.float32, device=anchors.device).expand(b)
        temperature = temperature * self.temperature_factor          # sampled rows only: 0 stays 0 (greedy)
        seeds = torch.zeros(b, dtype=torch.int64, device=anchors.device) if seeds is None else seeds
        mask_token = draft.config.mask_token_id
        greedy = temperature <= 0
        sampling = not bool(greedy.all())
        with torch.inference_mode(), self.stopwatch("draft"):
            block_ids = torch.full((b, 1, block_size), mask_token, dtype=torch.long, device=anchors.device)
            block_ids[:, 0, 0] = anchors
            positions = start_positions[:, None, None] + torch.arange(block_size, device=anchors.device)  # [b, 1, B]
            hidden = draft.forward_blocks(block_ids, positions, self.kv, block_visibility(positions, self.positions, self.window, self.valid))
            hidden = hidden[:, 0, 1:]                                             # [b, T, H] positions 1..B-1
        with torch.inference_mode(), self.stopwatch("draft_head"):
            logits = draft.logits(hidden)                                          # [b, T, Vd] draft vocabulary
        u = uniforms(seeds, positions[:, 0, 1:], DRAFT) if sampling else None      # [b, T]
        with torch.inference_mode(), self.stopwatch("selector"):
            vocab = draft.config.vocab_size
            selector = draft.selector
            if selector is not None:
                cand_logits, cand = logits.topk(min(selector.top_k, logits.shape[-1]), dim=-1)
                cand_ids = draft.draft_to_target(cand)                              # [b, T, K] target ids
                scores = selector.pair_scores(hidden, anchors, cand_ids, cand_logits)
                path = selector.walk(scores, cand_ids, temperature, u)
                q = None if path.q is None else dense_q(cand_ids, path.q, vocab)
                second = selector.second_path(scores, cand_ids, path) if self.lattice and bool(greedy.any()) else None
                return Proposal(path.tokens, q, path.confidence, second)
            scale = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None, None]
            q = torch.softmax(logits / scale, dim=-1)                              # [b, T, Vd]
            picks = logits.argmax(dim=-1)
            if sampling:
                picks = torch.where(greedy[:, None], picks, sample_from(q, u))
            confidence = q.gather(-1, picks.unsqueeze(-1)).squeeze(-1)
            if sampling and draft.reduced_vocabulary:  # q over the target's vocabulary, 0 off the draft's
                q = torch.zeros(*q.shape[:-1], vocab, dtype=q.dtype, device=q.device).index_copy_(
                    -1, draft.draft_token_ids(), q)
            return Proposal(draft.draft_to_target(picks), q if sampling else None, confidence)


@dataclass(frozen=True)
class Drafter:
    block_size: int
    new: Callable[[Stopwatch], "DraftProposer"]

    @classmethod
    def of(cls, draft: DFlash2DraftModel, lattice: bool = False) -> "Drafter":
        return cls(draft.config.block_size, lambda stopwatch: DraftProposer(draft, stopwatch, lattice=lattice))


def _gather_slots(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tensor [b, heads, S, d], index [b, S'] -> [b, heads, S', d]."""
    return tensor.gather(2, index[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[-1]))
