"""`model.mask.block_visibility` is the decoding-time rule: on the proposer's own cache states
(left-padded prefills, ragged appends, any window) it equals the rule the proposer applied before it
moved to the shared function, written out here as the reference: every valid cached context slot
inside the window of the query position, and the block itself."""
from __future__ import annotations

import pytest
import torch

from dflash2.decoding.proposers.draft import DraftProposer
from dflash2.model.mask import block_visibility
from dflash2.targets.tiny import tiny_draft, tiny_target


@pytest.fixture(scope="module")
def draft():
    return tiny_draft(tiny_target("llama"), block_size=4)


def _random_proposer(draft, window, g: torch.Generator) -> tuple[DraftProposer, torch.Tensor]:
    """A proposer after a left-padded prefill and a few ragged appends; returns it and each row's
    next position (the anchor's)."""
    draft.config.sliding_window = window
    proposer = DraftProposer(draft)
    rows = int(torch.randint(1, 5, (1,), generator=g))
    lengths = torch.randint(1, 12, (rows,), generator=g)
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] >= width - lengths[:, None]).long()          # [b, L] left padding
    features = torch.randn(rows, width, draft.fc.in_features, generator=g)
    proposer.add_rows(features, mask)
    next_position = lengths.clone()
    for _ in range(int(torch.randint(0, 4, (1,), generator=g))):
        q = int(torch.randint(1, 5, (1,), generator=g))
        counts = torch.randint(1, q + 1, (rows,), generator=g)
        proposer.append(torch.randn(rows, q, draft.fc.in_features, generator=g), counts, next_position)
        next_position = next_position + counts
    return proposer, next_position


def reference_mask(proposer: DraftProposer, block_positions: torch.Tensor, window) -> torch.Tensor:
    """[b, 1, B, S + B]: the cache holds only context before the anchor, so validity and the window
    are all there is to check."""
    ctx = proposer.valid[:, None, :].expand(-1, block_positions.shape[1], -1)              # [b, B, S]
    if window:
        ctx = ctx & (block_positions[:, :, None] - proposer.positions[:, None, :] < window)
    block = torch.ones(*block_positions.shape, block_positions.shape[1], dtype=torch.bool)
    return torch.cat([ctx, block], dim=-1)[:, None]


@pytest.mark.parametrize("window", [None, 0, 1, 3, 7, 64])
def test_reproduces_the_proposer_mask(draft, window):
    g = torch.Generator().manual_seed(0 if window is None else window + 1)
    for _ in range(20):
        proposer, start = _random_proposer(draft, window, g)
        block_positions = start[:, None] + torch.arange(4)                              # [b, B]
        expected = reference_mask(proposer, block_positions, window)
        got = block_visibility(block_positions[:, None], proposer.positions, window, proposer.valid)
        assert got.dtype == torch.bool and torch.equal(got, expected)


def test_window_is_per_query_position():
    # One block at 10..13, window 3: query 10 sees context 8, 9; query 13 sees none of 0..9.
    mask = block_visibility(torch.arange(10, 14)[None, None], torch.arange(10), 3)[0, 0]  # [4, 14]
    assert mask[0, :10].nonzero().flatten().tolist() == [8, 9]
    assert not mask[3, :10].any() and mask[:, 10:].all()
