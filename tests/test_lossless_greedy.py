"""Greedy speculative decoding is token-for-token the target's own greedy output (fp32)."""
from __future__ import annotations

import zlib

import pytest
import torch

from conftest import MODES, OracleDecoder, with_speculation
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets.tiny import tiny_draft

NUM_PROMPTS = 32
NEW_TOKENS = 24


def make_prompts(seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 20, (NUM_PROMPTS,), generator=g)
    return [torch.randint(3, vocab - 1, (int(n),), generator=g).tolist() for n in lengths]


_REFERENCE: dict = {}


def reference(family, target):
    """Hugging Face greedy generate(), one prompt at a time: the ground truth."""
    if family not in _REFERENCE:
        prompts = make_prompts(zlib.crc32(family.encode()) % 1000, target.config.vocab_size)   # not hash(): salted per process
        outs = []
        for p in prompts:
            ids = torch.tensor([p], device=target.device)
            gen = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
            outs.append(gen[0, len(p):].tolist())
        _REFERENCE[family] = (prompts, outs)
    return _REFERENCE[family]


def run_batched(decoder, prompts, config, batch_size):
    results = []
    for i in range(0, len(prompts), batch_size):
        results += decoder.generate(prompts[i:i + batch_size], config)
    return results


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_random_draft_matches_target_greedy(tiny_models, family, batch_size, block_size, mode):
    target, draft = tiny_models[family]
    prompts, expected = reference(family, target)
    decoder = with_speculation(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), mode)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=block_size)
    results = run_batched(decoder, prompts, config, batch_size)
    assert [r.tokens for r in results] == expected
    assert all(r.finish_reason == "length" for r in results)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_oracle_draft_reaches_block_size(tiny_models, family, block_size):
    target, _ = tiny_models[family]
    prompts, expected = reference(family, target)
    # max_new_tokens = 1 + k * block_size: every cycle can commit a full block.
    new_tokens = 1 + 2 * block_size
    decoder = OracleDecoder(TargetAdapter(target), prompts, expected, block_size)
    results = decoder.generate(prompts[:8], GenerationConfig(max_new_tokens=new_tokens))
    assert [r.tokens for r in results] == [e[:new_tokens] for e in expected[:8]]
    for r in results:
        assert r.stats.acceptance_length == block_size
        assert r.stats.position_acceptance() == [1.0] * (block_size - 1)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_always_wrong_draft_gives_one_token_per_cycle(tiny_models, family):
    target, _ = tiny_models[family]
    prompts, expected = reference(family, target)
    decoder = OracleDecoder(TargetAdapter(target), prompts, expected, 8, wrong=True)
    results = decoder.generate(prompts[:8], GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in results] == expected[:8]
    for r in results:
        assert r.stats.acceptance_length == 1.0
        assert r.stats.cycles == NEW_TOKENS - 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_stop_tokens_mid_block(tiny_models, family, batch_size, mode):
    """Rows stop at their first stop token (kept), wherever it falls in a block."""
    target, draft = tiny_models[family]
    prompts, expected = reference(family, target)
    stop = expected[0][5]  # a token the first row produces mid-way
    want = [e[: e.index(stop) + 1] if stop in e else e for e in expected]
    assert any(len(w) < NEW_TOKENS for w in want)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_token_ids=(stop,), block_size=8)
    for decoder in (with_speculation(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), mode),
                    with_speculation(OracleDecoder(TargetAdapter(target), prompts, expected, 8), mode)):
        results = run_batched(decoder, prompts, config, batch_size)
        assert [r.tokens for r in results] == want
        assert [r.finish_reason for r in results] == ["stop" if stop in e else "length" for e in expected]


def test_autoregressive_baseline_matches_hf(tiny_models):
    target, _ = tiny_models["gemma3"]
    prompts, expected = reference("gemma3", target)
    results = run_batched(SpeculativeDecoder(TargetAdapter(target)), prompts, GenerationConfig(max_new_tokens=NEW_TOKENS), 4)
    assert [r.tokens for r in results] == expected


def test_stream_yields_the_generated_tokens(tiny_models):
    target, draft = tiny_models["qwen3"]
    prompts, expected = reference("qwen3", target)
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft)
    chunks = list(decoder.stream(prompts[0], GenerationConfig(max_new_tokens=NEW_TOKENS)))
    assert sum(chunks, []) == expected[0]
    assert len(chunks) >= 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_requests_joining_a_running_batch_match_target_greedy(tiny_models, family, mode):
    """Continuous batching: requests join the running batch at cycle boundaries (their prefill
    merged into the ragged batch, whatever their lengths) and leave when done; every one is still
    the target's own greedy output."""
    target, draft = tiny_models[family]
    prompts, expected = reference(family, target)
    decoder = with_speculation(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), mode)
    session = decoder.session()
    lengths = [NEW_TOKENS, 7, NEW_TOKENS, 3, 12, NEW_TOKENS, 1, 9]
    outputs, order, waiting = {}, {}, list(range(len(lengths)))
    cycles = 0
    while waiting or session:
        if waiting and cycles % 3 == 0:  # two new requests every third cycle
            for i in waiting[:2]:
                [key] = session.add([prompts[i]], GenerationConfig(max_new_tokens=lengths[i]))
                order[key] = i
            waiting = waiting[2:]
        for event in session.step():
            outputs.setdefault(order[event.key], []).extend(event.tokens)
            if event.result is not None:
                assert event.result.tokens == outputs[order[event.key]]
        cycles += 1
    assert [outputs[i] for i in range(len(lengths))] == [expected[i][:n] for i, n in enumerate(lengths)]


def test_cancelled_request_leaves_the_others_intact(tiny_models):
    target, draft = tiny_models["llama"]
    prompts, expected = reference("llama", target)
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, speculate="always")
    session = decoder.session()
    keys = session.add(prompts[:3], GenerationConfig(max_new_tokens=NEW_TOKENS))
    outputs = {k: [] for k in keys}
    for step in range(100):
        if step == 2:
            session.cancel(keys[1])
        for event in session.step():
            outputs[event.key] += event.tokens
        if not session:
            break
    assert outputs[keys[0]] == expected[0] and outputs[keys[2]] == expected[2]
    assert len(outputs[keys[1]]) < NEW_TOKENS


@pytest.mark.parametrize("mode", ["always", "random"])
@pytest.mark.parametrize("use_selector", [True, False])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_reduced_vocabulary_draft_matches_target_greedy(tiny_models, family, use_selector, mode):
    """A draft that can only propose 40 of the 128 tokens: it misses whatever lies outside, the
    output is still the target's."""
    target, _ = tiny_models[family]
    prompts, expected = reference(family, target)
    draft = tiny_draft(target, draft_vocab_size=40, use_selector=use_selector, seed=3).to(target.device)
    decoder = with_speculation(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), mode)
    results = run_batched(decoder, prompts, GenerationConfig(max_new_tokens=NEW_TOKENS), 4)
    assert [r.tokens for r in results] == expected
