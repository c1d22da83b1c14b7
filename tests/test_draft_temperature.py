"""Sampled rows are drafted at SAMPLED_DRAFT_TEMPERATURE times their temperature: the proposal's q
is that sharper distribution (the one its tokens were drawn from, which exactness needs), greedy
rows do not change. Distributional exactness itself is tests/test_lossless_sampling.py's."""
from __future__ import annotations

import torch

from dflash2.decoding.proposers.draft import SAMPLED_DRAFT_TEMPERATURE, DraftProposer
from dflash2.targets.tiny import tiny_draft, tiny_target


def _draft():
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4)
    draft.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    return draft


def _proposal(draft, factor, temperature):
    g = torch.Generator().manual_seed(0)
    proposer = DraftProposer(draft, temperature_factor=factor)
    proposer.add_rows(torch.randn(2, 6, draft.fc.in_features, generator=g), torch.ones(2, 6, dtype=torch.long))
    return proposer.propose(torch.tensor([3, 7]), torch.tensor([6, 6]), 4, temperature, torch.tensor([1, 2]))


def test_sampled_rows_draw_from_the_sharper_distribution():
    assert 0 < SAMPLED_DRAFT_TEMPERATURE < 1
    draft = _draft()
    own = _proposal(draft, 1.0, torch.tensor([1.0, 1.0]))
    sharp = _proposal(draft, SAMPLED_DRAFT_TEMPERATURE, torch.tensor([1.0, 1.0]))
    at_lower_t = _proposal(draft, 1.0, torch.tensor([SAMPLED_DRAFT_TEMPERATURE] * 2))
    torch.testing.assert_close(sharp.q, at_lower_t.q)            # the factor is a temperature, nothing else
    assert torch.equal(sharp.tokens, at_lower_t.tokens)
    # sharper: the first position's distribution (the anchor known, no path dependence) has a higher top
    assert bool((sharp.q[:, 0].max(-1).values > own.q[:, 0].max(-1).values).all())
    picked = sharp.q.gather(-1, sharp.tokens.unsqueeze(-1)).squeeze(-1)
    assert bool((picked > 0).all())                               # every drawn token has mass under q


def test_greedy_rows_are_unchanged():
    draft = _draft()
    own, sharp = _proposal(draft, 1.0, 0.0), _proposal(draft, SAMPLED_DRAFT_TEMPERATURE, 0.0)
    assert sharp.q is None and torch.equal(own.tokens, sharp.tokens)
    torch.testing.assert_close(own.confidence, sharp.confidence)
