"""Draft side of a decoding cycle: the draft's context cache and one block proposal (SPEC §3 step 1).

Contract:
- `DraftProposer(draft)` holds, per draft layer, the K/V of the target features committed so far
  (left-padded like the target cache) plus their positions and validity mask.
- `add_rows(features, mask)` adds the context of newly prefilled rows (the first call starts the
  batch; later rows are merged in, left-padded like the target cache, and come last);
  `append(features, counts, first_position)` adds the features of the tokens committed in a
  cycle (the first counts[r] of the q verified positions); `select_rows(rows)` drops sequences.
- `propose(anchors, start_positions, block_size, temperature, seeds)` runs one block
  `[anchor, MASK x (block_size-1)]` at positions start..start+block_size-1 and returns a `Proposal`:
  draft tokens [b, T], the dense distribution q [b, T, V] each was drawn from (None when every row
  is greedy) and the draft's confidence in each token [b, T] (the probability it gave the token).
  `temperature` and `seeds` are per row ([b]); sampled rows draw with `dflash2.rng` uniforms keyed
  by (seed, position). With a selector the tokens are a path through the top-K candidates; without
  one (DFlash v1) they are per-position argmax / samples of the draft logits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash2.decoding.acceptance import dense_q
from dflash2.model.draft import DFlash2DraftModel
from dflash2.model.mask import block_visibility
from dflash2.decoding.ragged import right_align
from dflash2.decoding.timing import Stopwatch
from dflash2.rng import DRAFT, sample_from, uniforms


@dataclass
class Proposal:
    tokens: torch.Tensor            # [b, T]
    q: torch.Tensor | None          # [b, T, V] (None when every row is greedy)
    confidence: torch.Tensor | None = None   # [b, T] the draft's probability of each token


class DraftProposer:
    def __init__(self, draft: DFlash2DraftModel, stopwatch: Stopwatch | None = None):
        self.draft = draft
        self.window = draft.config.sliding_window
        self.stopwatch = stopwatch or Stopwatch(None)
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.positions: torch.Tensor | None = None   # [b, S]
        self.valid: torch.Tensor | None = None       # [b, S] bool

    def add_rows(self, features: torch.Tensor, mask: torch.Tensor) -> None:
        """features [n, L, F] from a prefill, mask [n, L] (1 = real token)."""
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

    def append(self, features: torch.Tensor, counts: torch.Tensor, first_position: torch.Tensor) -> None:
        """features [b, q, F] at positions first_position[r] + 0..q-1; keep the first counts[r]."""
        q = features.shape[1]
        top = int(counts.max())
        uniform = bool((counts == top).all())
        if uniform:  # every row keeps the same count: no re-alignment, only the kept slots are projected
            features = features[:, :top]
        positions = first_position[:, None] + torch.arange(features.shape[1], device=features.device)   # [b, q']
        with torch.inference_mode():
            new_kv = self.draft.context_kv(features, positions)
        if uniform:
            self.kv = [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self.kv, new_kv)]
            self.positions = torch.cat([self.positions, positions], dim=1)
            self.valid = F.pad(self.valid, (0, top), value=True)
            return
        valid = torch.arange(q, device=features.device)[None, :] < counts[:, None]
        shift = top - counts

        def grow(old: torch.Tensor, new: torch.Tensor, slot_dim: int) -> torch.Tensor:
            both = torch.cat([old, new], dim=slot_dim)
            if slot_dim == 2:  # [b, heads, slots, d] -> slots on dim 1 for right_align
                return right_align(both.transpose(1, 2), shift, top - q).transpose(1, 2)
            return right_align(both, shift, top - q)

        self.kv = [(grow(k, nk, 2), grow(v, nv, 2)) for (k, v), (nk, nv) in zip(self.kv, new_kv)]
        self.positions = grow(self.positions, positions, 1)
        self.valid = grow(self.valid, valid, 1)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.kv = [(k[rows], v[rows]) for k, v in self.kv]
        self.positions, self.valid = self.positions[rows], self.valid[rows]

    def propose(self, anchors: torch.Tensor, start_positions: torch.Tensor, block_size: int,
                temperature: torch.Tensor | float = 0.0, seeds: torch.Tensor | None = None) -> Proposal:
        draft = self.draft
        b = anchors.shape[0]
        temperature = torch.as_tensor(temperature, dtype=torch.float32, device=anchors.device).expand(b)
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
                return Proposal(path.tokens, q, path.confidence)
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
