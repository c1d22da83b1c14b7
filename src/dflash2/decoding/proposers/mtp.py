"""MTP side of a decoding cycle: the head's KV cache over the committed sequence and k recursive steps.

Contract:
- `MtpProposer(head, final_norm)`: `head` an `MtpHead` bound to the target, `final_norm` the
  target's final norm (`model.mtp.target_final_norm`). The same calls as `DraftProposer`, whose
  `following` (`loop.following`: the committed token after each position whose features it gets)
  the head reads:
  - `add_rows(features, mask, following)`: a prefill's features [n, L, F] (the target's last
    layer, before its final norm), mask [n, L], following [n, L] (the prompt's next tokens, then
    the first generated one), left-padded like the target cache; the new rows come last.
  - `append(features, counts, first_position, defer, following)`: the first counts[r] of a cycle's
    q verified positions were committed; following [b, q] is the committed token after each (the
    accepted drafts, then the cycle's bonus token at index counts[r] - 1). Queued, like every
    append, until the head next runs (`propose`, or a change of rows).
  - `select_rows(rows)`; `propose(anchors, start_positions, block_size, temperature, seeds)` ->
    `Proposal` (tokens [b, T], q [b, T, V] when a row samples, confidence [b, T]).
- The cache: entry p pairs the target's final-norm hidden state at p - 1 with the committed token
  at p, at position p. Every entry is committed (both halves are known only once p - 1 and p are),
  so nothing is ever rolled back: rejected drafts never enter (their features are dropped by
  `counts`, rows that keep fewer leave masked holes, compacted by one gather when they take too
  much room). The queued entries run through the head's layer in one causal pass (each attends
  to the committed entries before it); the newest entry of each row is the anchor's, whose output
  predicts d_1.
- `propose` then applies the head recursively, T = block_size - 1 steps: step i > 1 feeds the
  head's own output of step i - 1 and the token it chose, d_{i-1}, at position start + i - 1,
  attending to the committed cache and the steps before it (their K/V are dropped afterwards).
  Greedy rows take the argmax; sampled rows draw at `temperature_factor` x their temperature
  (`draft.SAMPLED_DRAFT_TEMPERATURE`) with `dflash2.runtime.rng` uniforms keyed by (seed, position), and
  q is the distribution each token was drawn from, so acceptance stays exact.
- Stopwatch phases: "draft" (the layer passes) and "draft_head" (the LM head and the picks), the
  phases `yardstick` sums into draft milliseconds per cycle.
- `mtp_drafter(head, final_norm)`: the `draft.Drafter` of a head (its block size, a fresh
  `MtpProposer` per batch); `kinds.drafter_for` picks it for a head.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash2.decoding.proposers.draft import SAMPLED_DRAFT_TEMPERATURE, Drafter, Proposal
from dflash2.decoding.verifier.ragged import compaction_index, worth_compacting
from dflash2.decoding.loop.timing import Stopwatch
from dflash2.errors import require
from dflash2.model.mtp import KVSplice, MtpHead
from dflash2.runtime.rng import DRAFT, sample_from, uniforms


class MtpProposer:
    def __init__(self, head: MtpHead, final_norm: nn.Module, stopwatch: Stopwatch | None = None,
                 temperature_factor: float = SAMPLED_DRAFT_TEMPERATURE):
        self.head, self.final_norm = head, final_norm
        self.temperature_factor = temperature_factor
        self.stopwatch = stopwatch or Stopwatch(None)
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None   # K, V [b, kv_heads, S, d]
        self.positions: torch.Tensor | None = None                 # [b, S]
        self.valid: torch.Tensor | None = None                     # [b, S] bool
        self.last_out: torch.Tensor | None = None                  # [b, H] output of each row's newest entry
        self.last_position: torch.Tensor | None = None             # [b] its position
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    # ------------------------------------------------------------------ the committed cache
    def _run(self, features, following, positions, valid, past):
        """One causal pass of entries (features [b, q, F], following / positions [b, q], valid [b, q])
        after the committed cache `past` (None: none) -> ((K, V) of the entries, outputs [b, q, H])."""
        head = self.head
        q = positions.shape[1]
        with torch.inference_mode():
            x = head.fuse(self.final_norm(features), following)                                   # [b, q, H]
            earlier = (positions[:, None, :] <= positions[:, :, None]) & valid[:, None, :]         # [b, q, q]
            earlier |= torch.eye(q, dtype=torch.bool, device=x.device)     # a padding query sees itself (no NaN)
            mask = earlier if past is None else torch.cat([self.valid[:, None, :].expand(-1, q, -1), earlier], -1)
            splice = KVSplice(past)
            out = head.run_layer(x, positions, splice, mask[:, None])
        return splice.new, out

    def add_rows(self, features: torch.Tensor, mask: torch.Tensor, following: torch.Tensor | None = None) -> None:
        require(following is not None, "the MTP proposer needs the committed tokens (following=...)")
        self._flush()
        valid = mask.bool()
        positions = (mask.cumsum(-1) - 1).clamp(min=0) + 1              # entry p: hidden at p - 1, token at p
        kv, out = self._run(features, following.to(features.device), positions, valid, None)   # the prefill's share
        last_out, last_position = out[:, -1], positions[:, -1]          # left-padded: the right edge is the newest
        if self.kv is None:
            self.kv, self.positions, self.valid = kv, positions, valid
            self.last_out, self.last_position = last_out, last_position
            return
        width = max(self.positions.shape[1], positions.shape[1])

        def slots(x: torch.Tensor) -> torch.Tensor:  # left-pad the slot dim to `width`: [b, S] or [b, kv, S, d]
            return F.pad(x, (width - x.shape[1], 0)) if x.dim() == 2 else F.pad(x, (0, 0, width - x.shape[2], 0))

        self.kv = tuple(torch.cat([slots(old), slots(new)]) for old, new in zip(self.kv, kv))
        self.positions = torch.cat([slots(self.positions), slots(positions)])
        self.valid = torch.cat([slots(self.valid), slots(valid)])
        self.last_out = torch.cat([self.last_out, last_out])
        self.last_position = torch.cat([self.last_position, last_position])

    def append(self, features: torch.Tensor, counts: torch.Tensor, first_position: torch.Tensor,
               defer: bool = False, following: torch.Tensor | None = None) -> None:
        require(following is not None, "the MTP proposer needs the committed tokens (following=...)")
        q = features.shape[1]
        steps = torch.arange(q, device=features.device)
        positions = first_position[:, None] + 1 + steps                                        # [b, q]
        self._pending.append((features, following, positions, steps[None, :] < counts[:, None]))

    def _flush(self) -> None:
        if not self._pending:
            return
        features, following, positions, valid = (torch.cat(parts, dim=1) for parts in zip(*self._pending))
        self._pending = []
        kv, out = self._run(features, following, positions, valid, self.kv)
        self.kv = tuple(torch.cat([old, new], dim=2) for old, new in zip(self.kv, kv))
        self.positions = torch.cat([self.positions, positions], dim=1)
        self.valid = torch.cat([self.valid, valid], dim=1)
        newest = torch.where(valid, positions, -1).argmax(dim=1)                               # [b]
        has = valid.any(dim=1)
        rows = torch.arange(out.shape[0], device=out.device)
        self.last_out = torch.where(has[:, None], out[rows, newest], self.last_out)
        self.last_position = torch.where(has, positions[rows, newest], self.last_position)
        if worth_compacting(self.valid):
            index = compaction_index(self.valid)                                               # [b, S']
            self.kv = tuple(t.gather(2, index[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[-1]))
                            for t in self.kv)
            self.positions, self.valid = self.positions.gather(1, index), self.valid.gather(1, index)

    def select_rows(self, rows: torch.Tensor) -> None:
        self._flush()
        self.kv = tuple(t[rows] for t in self.kv)
        self.positions, self.valid = self.positions[rows], self.valid[rows]
        self.last_out, self.last_position = self.last_out[rows], self.last_position[rows]

    # ------------------------------------------------------------------ the proposal
    def propose(self, anchors: torch.Tensor, start_positions: torch.Tensor, block_size: int,
                temperature: torch.Tensor | float = 0.0, seeds: torch.Tensor | None = None) -> Proposal:
        with self.stopwatch("draft"):
            self._flush()
        require(bool((self.last_position == start_positions).all()),
                "MTP proposer out of step with the target: its newest entry is not the anchor's")
        head, b, steps = self.head, anchors.shape[0], block_size - 1
        device = anchors.device
        temperature = torch.as_tensor(temperature, dtype=torch.float32, device=device).expand(b)
        temperature = temperature * self.temperature_factor          # sampled rows only: 0 stays 0 (greedy)
        seeds = torch.zeros(b, dtype=torch.int64, device=device) if seeds is None else seeds
        greedy = temperature <= 0
        sampling = not bool(greedy.all())
        scale = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]        # [b, 1]
        u = uniforms(seeds, start_positions[:, None] + 1 + torch.arange(steps, device=device), DRAFT) if sampling \
            else None                                                                           # [b, T]
        hidden, speculative, picks, qs, confidence = self.last_out, None, [], [], []
        for i in range(steps):
            if i > 0:
                with torch.inference_mode(), self.stopwatch("draft"):
                    x = head.fuse(hidden[:, None], picks[-1][:, None])                            # [b, 1, H]
                    past = self.kv if speculative is None else tuple(torch.cat(p, dim=2) for p in zip(self.kv, speculative))
                    seen = torch.cat([self.valid, torch.ones(b, i, dtype=torch.bool, device=device)], dim=1)
                    splice = KVSplice(past)
                    hidden = head.run_layer(x, start_positions[:, None] + i, splice, seen[:, None, None])[:, 0]
                    speculative = splice.new if speculative is None else tuple(
                        torch.cat(p, dim=2) for p in zip(speculative, splice.new))
            with torch.inference_mode(), self.stopwatch("draft_head"):
                logits = head.logits(hidden)                                                   # [b, V]
                q = torch.softmax(logits / scale, dim=-1)
                pick = logits.argmax(dim=-1)
                if sampling:
                    pick = torch.where(greedy, pick, sample_from(q, u[:, i]))
                picks.append(pick)
                qs.append(q)
                confidence.append(q.gather(-1, pick[:, None])[:, 0])
        return Proposal(torch.stack(picks, dim=1), torch.stack(qs, dim=1) if sampling else None,
                        torch.stack(confidence, dim=1))


def mtp_drafter(head: MtpHead, final_norm: nn.Module) -> Drafter:
    return Drafter(head.config.block_size, lambda stopwatch: MtpProposer(head, final_norm, stopwatch))
