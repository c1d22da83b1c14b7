"""Sibling decoders over one target: `SpeculativeDecoder.variant` is the one way to get one, their
sessions take turns on the target's batch, and the target's own batch survives a start-up timing
run in the middle of a session (`TargetAdapter.aside`)."""
from __future__ import annotations

import pytest
import torch

from conftest import TEST_DEVICE
from dflash2.decoding import GenerationConfig, SpeculativeDecoder, TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import tiny_draft, tiny_target

PROMPTS = [[5, 9, 11, 13, 17, 5, 9, 11], [3, 4, 5, 6]]


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(0)
    target = tiny_target("llama", seed=0).to(TEST_DEVICE)
    draft = tiny_draft(target, seed=0).to(TEST_DEVICE)
    return SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, proposer="hybrid")


def test_a_variant_shares_the_target_and_learns_afresh(decoder):
    config = GenerationConfig(max_new_tokens=12)
    plain = decoder.variant(speculate="never")
    lookup = decoder.variant("lookup")
    again = decoder.variant()
    assert plain.target is lookup.target is again.target is decoder.target
    assert plain.proposer is None and plain.speculate == "never" and plain.block_size(config) == 1
    assert lookup.proposer == "lookup" and lookup.draft is None
    assert again.policy is not decoder.policy and again.policy.costs is decoder.policy.costs
    assert lookup.policy.costs is not decoder.policy.costs     # another proposer: its own block, its own figures
    want = [r.tokens for r in plain.generate(PROMPTS, config)]
    for sibling in (decoder, lookup, again, decoder.variant("draft", speculate="always")):
        assert [r.tokens for r in sibling.generate(PROMPTS, config)] == want
    with pytest.raises(DFlash2Error, match="needs a draft"):
        lookup.variant("hybrid")


def test_sessions_over_one_target_take_turns(decoder):
    config = GenerationConfig(max_new_tokens=6)
    plain = decoder.variant(speculate="never")
    first, second = decoder.session(), plain.session()
    first.add(PROMPTS[:1], config)
    tokens = [t for event in first.step() for t in event.tokens]
    second.add(PROMPTS[1:], config)
    with pytest.raises(DFlash2Error, match="decoders over one target take turns"):
        second.step()                                # the first one's rows hold the target's batch
    while first:
        tokens += [t for event in first.step() for t in event.tokens]
    later = []
    while second:                                    # the first one's batch is done: the target is free
        later += [t for event in second.step() for t in event.tokens]
    assert [tokens, later] == [r.tokens for r in plain.generate(PROMPTS, config)]


def test_the_running_batch_survives_a_timing_run_put_aside(decoder):
    config = GenerationConfig(max_new_tokens=16)
    want = decoder.variant(speculate="never").generate(PROMPTS, config)
    sibling = decoder.variant()
    session = sibling.session(fixed=True)
    keys = session.add(PROMPTS, config)
    out = {key: [] for key in keys}
    for event in session.step() + session.step():
        out[event.key] += event.tokens
    cache, mask = sibling.target.cache, sibling.target.mask.clone()
    sibling.policy.costs.calibrate(sibling.target, 8)            # passes of its own, on a dummy context
    assert sibling.target.cache is cache and torch.equal(sibling.target.mask, mask)
    while session:
        for event in session.step():
            out[event.key] += event.tokens
    assert [out[key] for key in keys] == [r.tokens for r in want]
