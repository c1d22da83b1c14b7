"""Training batches: anchor sampling, packed block inputs, labels and the block-sparse mask (docs/spec.md §4).

Contract:
- An `Example` is one tokenised conversation: `input_ids` [L] and `loss_mask` [L] (True on the
  assistant tokens the draft must learn to predict) plus `key`, a pair of ints (epoch, sample index)
  that seeds its anchor draw, so anchors depend only on (seed, epoch, sample) and never on the
  batch it lands in, the rank that processes it, or whether the run was resumed.
- `sample_anchors(loss_mask, block_size, num_anchors, generator)`: anchor `a` is a candidate iff it
  is itself supervised (at inference the anchor is always a committed response token), its first
  label `a + 1` is supervised, and the block fits: `a + block_size <= L`. Up to `num_anchors`
  candidates are drawn uniformly without replacement and returned sorted.
- An `Example` with `anchors` set (a replayed record, `training.replay`) keeps exactly those
  anchors instead of drawing; the batch then marks its blocks in `replayed` [b, N] bool (None when
  no example has anchors of its own, so batches without replay are what they always were).
- `build_batch(examples, ...)` packs all blocks of a sequence for ONE draft forward:
    block_ids       [b, N, B]   [anchor token, MASK x (B-1)]
    block_positions [b, N, B]   anchor .. anchor + B - 1
    labels          [b, N, B-1] input_ids[anchor + k], k = 1..B-1
    label_mask      [b, N, B-1] supervised label of a real block
    attn_mask       [b, 1, N*B, L + N*B] bool, True = visible; keys are [context | block_0 .. block_N-1]
  N is the largest anchor count in the batch; padding blocks (block_valid False, anchor 0) see only
  themselves and carry no labels. Sequences are right-padded to the longest (attention_mask marks
  real tokens; a real block's anchor is before its row's padding, so no block sees padding).
- `attn_mask` is `model.mask.block_visibility(block_positions, 0..L-1, window)`: query p of a block
  anchored at `a` sees context position c iff c < a and p - c < window, every position of its own
  block (bidirectional) and nothing of other blocks: the rule the decoding-time proposer uses.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from dflash2.errors import require
from dflash2.model.mask import block_visibility


@dataclass
class Example:
    input_ids: torch.Tensor          # [L] long
    loss_mask: torch.Tensor          # [L] bool
    key: tuple[int, int] = (0, 0)    # (epoch, sample index): seeds the anchor draw
    index: int = 0                   # sample index in the dataset (feature-cache key)
    anchors: torch.Tensor | None = None  # [n] given anchors (a replayed record); None: drawn


@dataclass
class Batch:
    input_ids: torch.Tensor          # [b, L]
    attention_mask: torch.Tensor     # [b, L] long, 1 = real token
    positions: torch.Tensor          # [b, L]
    anchors: torch.Tensor            # [b, N]
    block_valid: torch.Tensor        # [b, N] bool
    block_ids: torch.Tensor          # [b, N, B]
    block_positions: torch.Tensor    # [b, N, B]
    labels: torch.Tensor             # [b, N, B-1]
    label_mask: torch.Tensor         # [b, N, B-1] bool
    attn_mask: torch.Tensor          # [b, 1, N*B, L + N*B] bool
    indices: list[int]               # dataset index of each row
    replayed: torch.Tensor | None = None  # [b, N] bool blocks from the replay buffer (None: no replay rows)

    def to(self, device: torch.device | str) -> "Batch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=True)
        return Batch(**moved)

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def num_fresh_tokens(self) -> int:
        """Tokens of the rows drawn from the data, not of replayed records."""
        if self.replayed is None:
            return self.num_tokens
        return int(self.attention_mask[~self.replayed.any(dim=1)].sum())


def anchor_generator(seed: int, key: tuple[int, int]) -> torch.Generator:
    """A CPU generator seeded by (run seed, epoch, sample index) only."""
    epoch, index = key
    mixed = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) % (1 << 63)
    return torch.Generator().manual_seed(mixed)


def sample_anchors(loss_mask: torch.Tensor, block_size: int, num_anchors: int,
                   generator: torch.Generator) -> torch.Tensor:
    """loss_mask [L] bool -> sorted anchor positions [n], n <= num_anchors (n = 0 if none fit)."""
    length = loss_mask.shape[0]
    if length < block_size:
        return torch.zeros(0, dtype=torch.long)
    room = length - block_size + 1                                          # anchors 0 .. L-B
    mask = loss_mask.bool()
    candidates = torch.nonzero(mask[:room] & mask[1:room + 1], as_tuple=False).flatten()  # [c]
    if candidates.numel() > num_anchors:
        pick = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
        candidates = candidates[pick]
    return candidates.sort().values


def build_batch(examples: list[Example], *, block_size: int, num_anchors: int, mask_token_id: int,
                window: int | None, seed: int, pad_token_id: int = 0) -> Batch:
    """Pad `examples` into one batch with up to `num_anchors` blocks per sequence (see module doc)."""
    require(len(examples) > 0, "build_batch needs at least one example")
    b = len(examples)
    length = max(int(e.input_ids.shape[0]) for e in examples)
    input_ids = torch.full((b, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(b, length, dtype=torch.long)
    loss_mask = torch.zeros(b, length, dtype=torch.bool)
    anchor_lists = []
    for row, example in enumerate(examples):
        n_tok = int(example.input_ids.shape[0])
        input_ids[row, :n_tok] = example.input_ids.long()
        attention_mask[row, :n_tok] = 1
        loss_mask[row, :n_tok] = example.loss_mask.bool()
        if example.anchors is not None:
            given = example.anchors.long().sort().values
            require(given.numel() == 0 or (int(given[0]) >= 0 and int(given[-1]) + block_size <= n_tok),
                    f"replayed anchors of sequence {example.index} do not fit its {n_tok} tokens")
            anchor_lists.append(given)
        else:
            anchor_lists.append(sample_anchors(loss_mask[row, :n_tok], block_size, num_anchors,
                                               anchor_generator(seed, example.key)))
    n = max(1, max(a.numel() for a in anchor_lists))
    anchors = torch.zeros(b, n, dtype=torch.long)
    block_valid = torch.zeros(b, n, dtype=torch.bool)
    for row, found in enumerate(anchor_lists):
        anchors[row, :found.numel()] = found
        block_valid[row, :found.numel()] = True
    replayed = None
    if any(e.anchors is not None for e in examples):
        given = torch.tensor([e.anchors is not None for e in examples])            # [b]
        replayed = block_valid & given[:, None]

    offsets = torch.arange(block_size)
    block_positions = anchors[:, :, None] + offsets                                  # [b, N, B]
    block_ids = torch.full((b, n, block_size), mask_token_id, dtype=torch.long)
    block_ids[:, :, 0] = input_ids.gather(1, anchors)                                # anchor tokens
    label_pos = (anchors[:, :, None] + offsets[1:]).clamp(max=length - 1)            # [b, N, B-1]
    flat_pos = label_pos.reshape(b, -1)
    labels = input_ids.gather(1, flat_pos).view_as(label_pos)
    label_mask = loss_mask.gather(1, flat_pos).view_as(label_pos) & block_valid[:, :, None]
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        positions=torch.arange(length)[None, :].expand(b, length).contiguous(),
        anchors=anchors,
        block_valid=block_valid,
        block_ids=block_ids,
        block_positions=block_positions,
        labels=labels,
        label_mask=label_mask,
        attn_mask=block_visibility(block_positions, torch.arange(length), window),
        indices=[e.index for e in examples],
        replayed=replayed,
    )
