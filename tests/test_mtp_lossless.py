"""The MTP proposer (`decoding.proposers.mtp`) is lossless, and its cache is the committed sequence's.

Greedy output equals Hugging Face `generate()` token for token (fp32) for random MTP heads on the
attention-only and hybrid tiny families, alone and beside lookup (`hybrid`), at every speculation
mode (`random`: random lengths, sources and plain steps), with stop tokens mid-block and requests
joining a running batch. Every proposal the engine drew equals the head's proposal computed from
scratch on the committed prefix (one causal pass, no cache): the incremental cache, the holes of
rows that kept fewer tokens and the token trees' winning paths all feed the head what it should
see. Sampled output follows the target's distribution (chi-square, the method of
test_lossless_sampling.py), and the same test rejects broken acceptance rules with the MTP head.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import dflash2.decoding.loop.engine as engine_module
from conftest import MODES, TEST_DEVICE, RandomLengthPolicy, with_speculation
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.policy.cycle import CyclePlan
from dflash2.decoding.proposers.lookup import SuffixStore
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.model.mtp import KVSplice, create_mtp_head, target_final_norm
from dflash2.targets.tiny import tiny_target
from test_lossless_greedy import run_batched
from test_lossless_hybrid import hf_greedy, join_two_every_other_cycle
from test_lossless_sampling import (SAMPLES, SETTINGS, VOCAB, PROMPT, accept_ignoring_q, chi_square_pvalue,
                                    exact_joint, resample_from_p)
from test_tree import TreePolicy

NEW_TOKENS = 20
FAMILIES = ("llama", "qwen3", "qwen3_5", "qwen3_next", "qwen3_5_moe")


class Models(dict):
    """family -> (target, head, prompts, HF greedy outputs), built on first use. Prompts repeat a
    phrase so that lookup proposes (and `hybrid` mixes both sources)."""

    def __missing__(self, family):
        target = tiny_target(family).to(TEST_DEVICE)
        head = create_mtp_head(target.config, block_size=6, seed=5).eval().to(TEST_DEVICE)
        g = torch.Generator().manual_seed(11)
        prompts = []
        for n in torch.randint(1, 9, (8,), generator=g).tolist():
            phrase = torch.randint(3, 127, (n,), generator=g).tolist()
            prompts.append((phrase * 3)[: 2 * n + 1])
        self[family] = (target, head, prompts, [hf_greedy(target, p, NEW_TOKENS) for p in prompts])
        return self[family]


@pytest.fixture(scope="module")
def models():
    return Models()


def decoder(target, head, proposer="mtp", mode="always"):
    return with_speculation(SpeculativeDecoder(TargetAdapter(target, head.config.target_layer_ids), head,
                                               proposer=proposer), mode)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("proposer,mode", [("mtp", m) for m in MODES] + [("hybrid", "random")])
def test_mtp_matches_hf_generate(models, family, mode, proposer):
    target, head, prompts, expected = models[family]
    results = run_batched(decoder(target, head, proposer, mode), prompts, GenerationConfig(max_new_tokens=NEW_TOKENS), 4)
    assert [r.tokens for r in results] == expected


@pytest.mark.parametrize("block_size", [2, 4])
def test_mtp_block_sizes_one_row_at_a_time(models, block_size):
    target, head, prompts, expected = models["qwen3_5"]
    results = run_batched(decoder(target, head), prompts[:3], GenerationConfig(max_new_tokens=NEW_TOKENS,
                                                                       block_size=block_size), 1)
    assert [r.tokens for r in results] == expected[:3]


def test_mtp_stop_tokens_mid_block(models):
    target, head, prompts, expected = models["llama"]
    stop = expected[0][5]
    want = [e[: e.index(stop) + 1] if stop in e else e for e in expected]
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_token_ids=(stop,))
    assert [r.tokens for r in run_batched(decoder(target, head, "hybrid", "random"), prompts, config, 4)] == want


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_mtp_requests_joining_a_running_batch(models, family):
    target, head, prompts, expected = models[family]
    lengths = [NEW_TOKENS, 6, NEW_TOKENS, 2, 13, NEW_TOKENS, 1, 9]
    outputs = join_two_every_other_cycle(decoder(target, head, "hybrid", "random"), prompts, lengths)
    assert [outputs[i] for i in range(len(prompts))] == [expected[i][:n] for i, n in enumerate(lengths)]


# ---------------------------------------------------------------------- the cache against a fresh computation
class DraftingRandomPolicy(RandomLengthPolicy):
    """Random lengths, sources and plain steps; the MTP pass runs whenever the plan says so, even
    where lookup covers every row."""

    def prepare(self, b, offer, block, can_draft=True):
        return CyclePlan(can_draft and block > 1, chooser=lambda offer, seconds: self.choose(b, offer, block))


class RecordingDecoder(SpeculativeDecoder):
    """Records, for every proposal, each row's request key, anchor position and proposed tokens."""

    def session(self, fixed=False):
        self.current = super().session(fixed)
        return self.current

    def new_proposer(self, stopwatch):
        proposer = super().new_proposer(stopwatch)
        propose = proposer.propose

        def recorded(anchors, start, block_size, temperature=0.0, seeds=None):
            proposal = propose(anchors, start, block_size, temperature, seeds)
            keys = [row.key for row in self.current.rows]
            self.log += list(zip(keys, start.tolist(), proposal.tokens.tolist()))
            return proposal

        proposer.propose = recorded
        return proposer


def fresh_recursion(head, target, norm, adapter, prefix: list[int], steps: int, forced: list[int] | None = None):
    """The head's recursion after `prefix` (its last token the anchor), from scratch: the target's
    features of the prefix, every entry in one causal pass, then `steps` steps, each feeding the
    token it chose (its greedy pick, or `forced[i]`) -> (tokens, outputs [steps, H])."""
    s = len(prefix) - 1                                                          # the anchor's position
    device = target.device
    with torch.inference_mode():
        _, features = adapter.features(torch.tensor([prefix[:-1]], device=device))          # [1, s, H]
        x = head.fuse(norm(features), torch.tensor([prefix[1:]], device=device))           # entries 1..s
        positions = torch.arange(1, s + 1, device=device)[None]
        splice = KVSplice()
        causal = torch.ones(s, s, dtype=torch.bool, device=device).tril()
        hidden = head.run_layer(x, positions, splice, causal[None, None])[:, -1]
        kv, tokens, outputs = splice.new, [], []
        for i in range(steps):
            if i:
                splice = KVSplice(kv)
                x = head.fuse(hidden[:, None], torch.tensor([[tokens[-1]]], device=device))
                hidden = head.run_layer(x, torch.tensor([[s + i]], device=device), splice,
                                        torch.ones(1, 1, 1, s + i, dtype=torch.bool, device=device))[:, 0]
                kv = tuple(torch.cat(p, dim=2) for p in zip(kv, splice.new))
            outputs.append(hidden[0])
            tokens.append(int(head.logits(hidden).argmax(dim=-1)) if forced is None else forced[i])
    return tokens, torch.stack(outputs)


@pytest.mark.parametrize("family,trees", [("llama", True), ("qwen3", False), ("qwen3_5", False)])
def test_every_proposal_equals_the_head_on_the_committed_prefix(models, family, trees):
    """Rows keep different counts (random lengths and sources; token trees on attention-only targets),
    so the MTP cache has holes and tree paths; each proposal must still be the head's on the prefix.
    Lookup reads the reference continuations from a shared suffix store, so it is often right and
    the rows accept anything from 0 to 5 tokens."""
    target, head, prompts, expected = models[family]
    store = SuffixStore()
    for prompt, output in zip(prompts, expected):
        store.add(prompt + output)
    dec = RecordingDecoder(TargetAdapter(target, head.config.target_layer_ids), head, proposer="hybrid",
                           suffix_store=store)
    dec.log = []
    dec.policy = TreePolicy(seed=3) if trees else DraftingRandomPolicy()
    results = dec.generate(prompts, GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in results] == expected
    sequences = [p + e for p, e in zip(prompts, expected)]
    adapter, norm = TargetAdapter(target, head.config.target_layer_ids), target_final_norm(target)
    try:
        for key, start, tokens in dec.log:
            assert fresh_recursion(head, target, norm, adapter, sequences[key][:start + 1], len(tokens))[0] == tokens
    finally:
        adapter.close()
    assert len(dec.log) > 20
    kept = {n for r in results for n in r.stats.committed_per_cycle}
    assert len(kept) >= 5, "rows kept too few different counts to exercise the cache's holes"
    if trees:
        assert sum(r.stats.tree_cycles for r in results) > 10


# ---------------------------------------------------------------------- sampling
@pytest.fixture(scope="module")
def sampling_models():
    target = tiny_target("qwen3", vocab_size=VOCAB, seed=3).to(TEST_DEVICE)
    return target, create_mtp_head(target.config, block_size=4, seed=9).eval().to(TEST_DEVICE)


def sample_cells(target, head, setting, mode, used=None):
    dec = decoder(target, head, "mtp", mode)
    results = dec.generate([PROMPT] * SAMPLES, GenerationConfig(max_new_tokens=3, seed=0, **setting))
    if used is not None:
        used.append(sum(r.stats.accepted_by_source.get("draft", 0) for r in results))
    triples = np.array([r.tokens for r in results])
    return triples[:, 0] * VOCAB * VOCAB + triples[:, 1] * VOCAB + triples[:, 2]


@pytest.mark.parametrize("setting,mode", [(SETTINGS[1], "random"), (SETTINGS[3], "always")],
                         ids=["T0.7-k5-random", "T1-p0.9-k6-always"])
def test_mtp_sampling_matches_target_distribution(sampling_models, setting, mode):
    target, head = sampling_models
    used = []
    pvalue = chi_square_pvalue(sample_cells(target, head, setting, mode, used), exact_joint(target, setting))
    assert used[0] > 1000, "too few MTP tokens accepted for the test to test the MTP proposer"
    assert pvalue > 1e-3, f"sampled distribution differs from the target's (p = {pvalue:.2e})"


@pytest.mark.parametrize("broken_rule", [accept_ignoring_q, resample_from_p])
def test_the_test_rejects_broken_rules_with_the_mtp_head(sampling_models, monkeypatch, broken_rule):
    target, head = sampling_models
    monkeypatch.setattr(engine_module, "sample_accept", broken_rule)
    pvalue = chi_square_pvalue(sample_cells(target, head, SETTINGS[0], "always"), exact_joint(target, SETTINGS[0]))
    assert pvalue < 1e-3, f"broken rule {broken_rule.__name__} was not detected (p = {pvalue:.2e})"
