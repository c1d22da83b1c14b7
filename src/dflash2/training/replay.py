"""On-policy replay of rejected blocks: `loss.replay_*` (the idea of Draft-OPD, arXiv 2605.29343).

Contract:
- A block is *rejected* when, under the draft's weights of the step that trained on it, its
  acceptance path (the selector's walk with a selector, else the argmax: `losses.BlockOutcome`,
  the count the logged tau is built from) gets at most `max_accepted` tokens right AND fails at a
  supervised label that was among the draft's top-K candidates there (a near miss: a ranking
  the draft can fix, unlike a token it does not consider at all).
- `ReplayBuffer(settings)` keeps up to `capacity` rejected blocks as (record index, anchor) with
  how many tokens they got right, the step that saw them and how often they were replayed.
  Priority: fewer tokens right first, then the more recent step, then (index, anchor), a total
  order, so everything below is deterministic; past `capacity` the lowest-priority blocks leave.
- `extend(micro_batches, sequences)`: a step of m uniformly drawn records (all its micro-batches)
  gets one more micro-batch of replay rows holding up to m x `replay_anchors(num_anchors,
  fraction)` of the buffer's blocks: whole records in priority order (a record's blocks ride in
  one row, at most `num_anchors` of them, best first), each an `Example` with exactly the recorded
  anchors. Taken blocks leave the buffer. The uniformly drawn rows keep the rest of the anchors
  (`fresh_anchors`), so a step trains on as many blocks as without replay. The replay rows form a
  micro-batch of their own so that they are padded only to the largest replay row's block count,
  not to the uniform rows' (a padding block costs a real block's forward); the trainer's
  normaliser spans every micro-batch of the step, so the loss is the same as in one batch.
- `observe(batch, outcome, step)` after each micro-batch's forward: every rejected block of the
  batch enters the buffer; a replayed block that is still rejected re-enters while it was
  replayed fewer than `max_times` times (`max_times` 1: gone once trained on again).
- `interval_metrics()`: {replay_share (replayed blocks / all blocks trained on), replay_blocks,
  replay_rows, replay_tokens (the replay rows' tokens: re-read context, not in the trainer's
  `tokens`), replay_tau (teacher-forced tau of the replayed blocks, before the step's update),
  replay_buffer (blocks held)} since the last call.
- `state_dict()` / `load_state_dict(state)`: plain lists of ints, saved in every checkpoint so
  `--resume` continues bit-identically. One process only: `require_one_process(fraction, world)`
  is the check (the CLI makes it before the target loads, the trainer again).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash2.errors import require
from dflash2.training.batches import Batch, Example
from dflash2.training.losses import BlockOutcome


def replay_anchors(num_anchors: int, fraction: float) -> int:
    """Anchors per row that replay takes (rounded share of `num_anchors`)."""
    return round(fraction * num_anchors)


def fresh_anchors(num_anchors: int, fraction: float) -> int:
    """Anchors a uniformly drawn row keeps under replay."""
    return num_anchors - replay_anchors(num_anchors, fraction)


def require_one_process(fraction: float, world: int) -> None:
    """Replay keeps one buffer in one process: a one-line error for `world` > 1 ranks."""
    require(fraction == 0 or world == 1, f"config key 'loss.replay_fraction'={fraction} needs one process "
                                         f"(the replay buffer is not shared across {world} ranks)")


@dataclass(frozen=True)
class ReplaySettings:
    """The `loss.replay_*` keys and the anchor count they split."""

    fraction: float
    capacity: int
    max_accepted: int
    max_times: int
    num_anchors: int

    @classmethod
    def from_section(cls, loss) -> "ReplaySettings":
        """From a `LossSection` (config.py)."""
        return cls(loss.replay_fraction, loss.replay_capacity, loss.replay_max_accepted,
                   loss.replay_max_times, loss.num_anchors)


@dataclass
class _Entry:
    accepted: int   # tokens the acceptance path got right
    step: int       # the step that saw it
    replays: int    # times it was replayed


Key = tuple[int, int]   # (record index, anchor)


class ReplayBuffer:
    def __init__(self, settings: ReplaySettings):
        self.settings = settings
        self.entries: dict[Key, _Entry] = {}
        self.in_flight: dict[Key, int] = {}      # replayed this step: key -> replays including this one
        self._zero_interval()

    def __len__(self) -> int:
        return len(self.entries)

    def _priority(self, key: Key) -> tuple:
        entry = self.entries[key]
        return entry.accepted, -entry.step, key[0], key[1]

    # ------------------------------------------------------------------ drawing
    def extend(self, micro_batches: list[list[Example]], sequences) -> list[list[Example]]:
        """The step's micro-batches, then one of replay rows if the buffer holds any (see the module doc)."""
        self.in_flight = {}                                   # what an earlier draw left unobserved is dropped
        per_row = replay_anchors(self.settings.num_anchors, self.settings.fraction)
        budget = per_row * sum(len(examples) for examples in micro_batches)
        by_record: dict[int, list[Key]] = {}
        for key in sorted(self.entries, key=self._priority):  # records by their best block, blocks best first
            by_record.setdefault(key[0], []).append(key)
        rows = []
        for index, keys in by_record.items():
            if budget == 0:
                break
            taken = keys[:min(self.settings.num_anchors, budget)]
            budget -= len(taken)
            for key in taken:
                self.in_flight[key] = self.entries.pop(key).replays + 1
            ids, mask = sequences[index]
            rows.append(Example(ids, mask, index=index, anchors=torch.tensor(sorted(a for _, a in taken))))
        return micro_batches + ([rows] if rows else [])

    # ------------------------------------------------------------------ recording
    def observe(self, batch: Batch, outcome: BlockOutcome, step: int) -> None:
        """Record the rejected blocks of `batch` (after its forward) and count the interval's blocks."""
        s = self.settings
        accepted = outcome.accepted.cpu()
        rejected = (outcome.near_miss & (outcome.accepted <= s.max_accepted)).cpu()          # [b, N]
        valid = batch.block_valid.cpu()
        replayed = batch.replayed.cpu() if batch.replayed is not None else torch.zeros_like(valid)
        anchors = batch.anchors.cpu()
        self.blocks += int(valid.sum())
        self.replay_blocks += int(replayed.sum())
        replay_rows = replayed.any(dim=1)                                                    # [b]
        self.replay_rows += int(replay_rows.sum())
        self.replay_tokens += int(batch.attention_mask.cpu()[replay_rows].sum())
        self.replay_tau += float((1 + accepted)[replayed].sum())
        for row, col in torch.nonzero(valid, as_tuple=False).tolist():
            key = (batch.indices[row], int(anchors[row, col]))
            replays = self.in_flight.pop(key, 0) if replayed[row, col] else 0
            if rejected[row, col] and replays < s.max_times:
                self.entries[key] = _Entry(int(accepted[row, col]), step, replays)
        if len(self.entries) > s.capacity:
            for key in sorted(self.entries, key=self._priority)[s.capacity:]:
                del self.entries[key]

    # ------------------------------------------------------------------ metrics and state
    def _zero_interval(self) -> None:
        self.blocks = self.replay_blocks = self.replay_rows = self.replay_tokens = 0
        self.replay_tau = 0.0

    def interval_metrics(self) -> dict:
        out = {"replay_share": self.replay_blocks / max(self.blocks, 1), "replay_blocks": self.replay_blocks,
               "replay_rows": self.replay_rows, "replay_tokens": self.replay_tokens,
               "replay_tau": self.replay_tau / self.replay_blocks if self.replay_blocks else None,
               "replay_buffer": len(self.entries)}
        self._zero_interval()
        return out

    def state_dict(self) -> dict:
        keys = list(self.entries)
        return {"keys": [list(k) for k in keys],
                "entries": [[self.entries[k].accepted, self.entries[k].step, self.entries[k].replays] for k in keys]}

    def load_state_dict(self, state: dict) -> None:
        self.entries = {(int(i), int(a)): _Entry(*(int(x) for x in e))
                        for (i, a), e in zip(state["keys"], state["entries"])}
        self.in_flight = {}
