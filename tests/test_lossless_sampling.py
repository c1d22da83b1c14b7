"""Sampled speculative output follows the target's processed distribution exactly.

Method: a tiny-vocabulary target (V = 8) and a random DFlash2 draft whose selector samples among
its top-4 candidates (so the residual rule off the candidates is exercised). 20,000 sequences of 3
new tokens are decoded in one batch; their joint distribution over the 512 possible triples is
compared with the exact one, computed by enumeration from the target's logits with an independent
(numpy) implementation of temperature / top-k / top-p. Pearson chi-square, cells with expected
count < 5 pooled; the test fails at p < 1e-3, i.e. a correct sampler fails it with probability
1e-3 for a random seed (the seeds here are fixed, so the outcome is deterministic). The same test
is run on deliberately broken acceptance rules and must reject them: it has power.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import dflash2.decoding.loop.engine as engine_module
from dflash2.decoding.loop.acceptance import sample_accept
from dflash2.runtime.rng import sample_from
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets.tiny import tiny_draft, tiny_target
from conftest import TEST_DEVICE, with_speculation

VOCAB = 8
SAMPLES = 20_000
ALPHA = 1e-3
PROMPT = [3, 5, 1, 6]
SETTINGS = [
    dict(temperature=1.0, top_p=1.0, top_k=0),
    dict(temperature=0.7, top_p=1.0, top_k=5),
    dict(temperature=1.3, top_p=0.8, top_k=0),
    dict(temperature=1.0, top_p=0.9, top_k=6),
]


def reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Independent numpy reference of the target's processed distribution (one position)."""
    scores = logits.astype(np.float64) / temperature
    if 0 < top_k < len(scores):
        kth = np.sort(scores)[::-1][top_k - 1]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        keep = np.zeros_like(probs, dtype=bool)
        mass = 0.0
        for token in order:
            keep[token] = True
            mass += probs[token]
            if mass >= top_p:
                break
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


def exact_joint(target, setting) -> np.ndarray:
    """P(t1, t2, t3 | PROMPT) for all VOCAB^3 triples, by enumeration."""
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    ids = torch.tensor([PROMPT + [a, b] for a, b in pairs], device=target.device)
    with torch.no_grad():
        logits = target(input_ids=ids).logits.double().cpu().numpy()
    n = len(PROMPT)
    p1 = reference_probs(logits[0, n - 1], **_args(setting))
    joint = np.zeros((VOCAB,) * 3)
    for row, (a, b) in enumerate(pairs):
        p2 = reference_probs(logits[row, n], **_args(setting))
        p3 = reference_probs(logits[row, n + 1], **_args(setting))
        joint[a, b] = p1[a] * p2[b] * p3
    return joint.reshape(-1)


def _args(setting):
    return dict(temperature=setting["temperature"], top_k=setting["top_k"], top_p=setting["top_p"])


@pytest.fixture(scope="module")
def models():
    target = tiny_target("qwen3", vocab_size=VOCAB, seed=3)
    draft = tiny_draft(target, block_size=4, top_k=4, seed=4)
    return target.to(TEST_DEVICE), draft.to(TEST_DEVICE)


def sample_triples(target, draft, setting, seed=0, mode="always", proposer=None, lookup_used=None) -> np.ndarray:
    adapter = TargetAdapter(target, None if draft is None else draft.config.target_layer_ids)
    decoder = SpeculativeDecoder(adapter, draft, proposer=proposer)
    if draft is not None or proposer is not None:
        with_speculation(decoder, mode)
    config = GenerationConfig(max_new_tokens=3, seed=seed, **setting)
    results = decoder.generate([PROMPT] * SAMPLES, config)
    if lookup_used is not None:  # lookup tokens verified and accepted, summed over the rows
        lookup_used += [sum(r.stats.cycles_by_source.get("lookup", 0) for r in results),
                        sum(r.stats.accepted_by_source.get("lookup", 0) for r in results)]
    triples = np.array([r.tokens for r in results])
    return triples[:, 0] * VOCAB * VOCAB + triples[:, 1] * VOCAB + triples[:, 2]


def chi_square_pvalue(cells: np.ndarray, probs: np.ndarray) -> float:
    observed = np.bincount(cells, minlength=len(probs)).astype(float)
    expected = probs * len(cells)
    assert observed[expected == 0].sum() == 0, "sampled a triple the target gives probability 0"
    small = (expected < 5) & (expected > 0)
    big = expected >= 5
    obs = np.append(observed[big], observed[small].sum())
    exp = np.append(expected[big], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("mode", ["always", "random"])
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"T{s['temperature']}-p{s['top_p']}-k{s['top_k']}")
def test_speculative_sampling_matches_target_distribution(models, setting, mode):
    """`random` verifies a random number of drafts each cycle and sometimes none (adaptive length
    and fallback at their most varied)."""
    target, draft = models
    pvalue = chi_square_pvalue(sample_triples(target, draft, setting, mode=mode), exact_joint(target, setting))
    assert pvalue > ALPHA, f"sampled distribution differs from the target's (p = {pvalue:.2e})"


@pytest.mark.parametrize("use_selector", [True, False])
def test_reduced_vocabulary_draft_sampling_matches_target_distribution(models, use_selector):
    """The draft proposes only 5 of the 8 tokens (q is 0 elsewhere): the residual rule covers the
    rest exactly."""
    target, _ = models
    draft = tiny_draft(target, block_size=4, top_k=4, seed=4, draft_vocab_size=5,
                       use_selector=use_selector).to(target.device)
    setting = SETTINGS[0]
    pvalue = chi_square_pvalue(sample_triples(target, draft, setting, mode="random"), exact_joint(target, setting))
    assert pvalue > ALPHA, f"sampled distribution differs from the target's (p = {pvalue:.2e})"


@pytest.mark.parametrize("proposer,mode", [("lookup", "always"), ("lookup", "auto"), ("hybrid", "random")])
def test_lookup_sampling_matches_target_distribution(models, proposer, mode):
    """A lookup token is a point-mass draft (q one-hot): accepted with the target's probability,
    else the next token comes from p with it removed. The prompt repeats tokens, so lookup proposes."""
    target, draft = models
    setting = SETTINGS[3]
    used = []
    cells = sample_triples(target, draft if proposer == "hybrid" else None, setting, mode=mode, proposer=proposer,
                           lookup_used=used)
    assert used[0] > 0 and used[1] > 0, "no lookup token was verified and accepted: the test does not test lookup"
    pvalue = chi_square_pvalue(cells, exact_joint(target, setting))
    assert pvalue > ALPHA, f"sampled distribution differs from the target's (p = {pvalue:.2e})"


def test_autoregressive_sampling_matches_target_distribution(models):
    target, _ = models
    setting = SETTINGS[2]
    pvalue = chi_square_pvalue(sample_triples(target, None, setting), exact_joint(target, setting))
    assert pvalue > ALPHA


def accept_ignoring_q(draft, p, q, u_accept, u_token, limit=None):
    """Broken: accept with probability p(d) instead of min(1, p/q)."""
    return sample_accept(draft, p, torch.ones_like(q), u_accept, u_token, limit)


def resample_from_p(draft, p, q, u_accept, u_token, limit=None):
    """Broken: on rejection draw from p instead of the residual max(p - q, 0)."""
    accepted, _ = sample_accept(draft, p, q, u_accept, u_token, limit)
    rows = torch.arange(draft.shape[0], device=draft.device)
    position = accepted.clamp(max=draft.shape[1])
    return accepted, sample_from(p[rows, position], u_token[rows, accepted])


@pytest.mark.parametrize("mode", ["always", "random"])
@pytest.mark.parametrize("broken_rule", [accept_ignoring_q, resample_from_p])
def test_the_test_rejects_broken_acceptance_rules(models, monkeypatch, broken_rule, mode):
    target, draft = models
    setting = SETTINGS[0]
    monkeypatch.setattr(engine_module, "sample_accept", broken_rule)
    pvalue = chi_square_pvalue(sample_triples(target, draft, setting, mode=mode), exact_joint(target, setting))
    assert pvalue < ALPHA, f"broken rule {broken_rule.__name__} was not detected (p = {pvalue:.2e})"


@pytest.mark.parametrize("broken_rule", [accept_ignoring_q, resample_from_p])
def test_the_test_rejects_broken_rules_for_lookup(models, monkeypatch, broken_rule):
    """Ignoring q: a point mass's q is 1 at its token, so the acceptance test is the same but the
    residual is all zero and the rule falls back on p (the second broken rule): both are caught."""
    target, _ = models
    setting = SETTINGS[0]
    monkeypatch.setattr(engine_module, "sample_accept", broken_rule)
    cells = sample_triples(target, None, setting, mode="always", proposer="lookup")
    pvalue = chi_square_pvalue(cells, exact_joint(target, setting))
    assert pvalue < ALPHA, f"broken rule {broken_rule.__name__} was not detected with lookup (p = {pvalue:.2e})"


def _shared_batch(decoder, setting: dict, seed: int, greedy_prompt: list[int]):
    """SAMPLES sampled rows of PROMPT and 64 greedy rows of `greedy_prompt` decoded in one session ->
    (sampled keys, greedy keys, key -> result)."""
    session = decoder.session()
    sampled = session.add([PROMPT] * SAMPLES, GenerationConfig(max_new_tokens=3, seed=seed, **setting))
    greedy = session.add([greedy_prompt] * 64, GenerationConfig(max_new_tokens=3))
    results = {}
    while session:
        for event in session.step():
            if event.result is not None:
                results[event.key] = event.result
    return sampled, greedy, results


def test_greedy_and_sampled_rows_share_a_batch(models):
    """Rows with different settings in one batch (as the server runs them): the greedy rows are the
    target's greedy output, the sampled rows follow the processed distribution exactly."""
    target, draft = models
    setting = SETTINGS[1]
    decoder = with_speculation(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), "random")
    sampled, greedy, finished = _shared_batch(decoder, setting, 11, PROMPT)
    results = {key: result.tokens for key, result in finished.items()}
    ids = torch.tensor([PROMPT], device=target.device)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3,
                               do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert all(results[k] == expected for k in greedy)
    triples = np.array([results[k] for k in sampled])
    cells = triples[:, 0] * VOCAB * VOCAB + triples[:, 1] * VOCAB + triples[:, 2]
    assert chi_square_pvalue(cells, exact_joint(target, setting)) > ALPHA


def test_a_seeded_request_is_the_same_alone_or_in_a_batch(models):
    target, draft = models
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, speculate="always")
    config = GenerationConfig(max_new_tokens=12, temperature=1.0, seed=1234)
    alone = decoder.generate([PROMPT], config)[0].tokens
    assert decoder.generate([PROMPT], config)[0].tokens == alone
    session = decoder.session()
    session.add([[2, 7, 1], PROMPT + [4]], GenerationConfig(max_new_tokens=9, temperature=0.8, seed=5))
    [key] = session.add([PROMPT], config)
    session.add([[6, 6]], GenerationConfig(max_new_tokens=20))
    got = []
    while session:
        got += [t for e in session.step() if e.key == key for t in e.tokens]
    assert got == alone
    other = decoder.generate([PROMPT], GenerationConfig(max_new_tokens=12, temperature=1.0, seed=1235))[0].tokens
    assert other != alone


@pytest.fixture(scope="module")
def hybrid_models():
    """A Gated DeltaNet hybrid (qwen3_5: three linear-attention layers, then attention): rejected drafts
    roll back recurrent and conv state."""
    target = tiny_target("qwen3_5", vocab_size=VOCAB, seed=3, num_layers=4)
    draft = tiny_draft(target, block_size=4, top_k=4, seed=4)
    return target.to(TEST_DEVICE), draft.to(TEST_DEVICE)


def test_hybrid_target_sampling_matches_its_distribution(hybrid_models):
    target, draft = hybrid_models
    setting = SETTINGS[3]
    pvalue = chi_square_pvalue(sample_triples(target, draft, setting, mode="random"), exact_joint(target, setting))
    assert pvalue > ALPHA, f"sampled distribution differs from the target's (p = {pvalue:.2e})"


def test_the_test_rejects_a_broken_rule_on_a_hybrid_target(hybrid_models, monkeypatch):
    target, draft = hybrid_models
    monkeypatch.setattr(engine_module, "sample_accept", resample_from_p)
    pvalue = chi_square_pvalue(sample_triples(target, draft, SETTINGS[0]), exact_joint(target, SETTINGS[0]))
    assert pvalue < ALPHA, f"broken rule resample_from_p was not detected (p = {pvalue:.2e})"


def _rows_beside_trees(target, draft, setting, greedy_prompt):
    """SAMPLES sampled rows of PROMPT and 64 greedy rows of `greedy_prompt` in one batch, every
    greedy row that can verifying the draft's and lookup's branches as a tree (`TreePolicy`):
    the sampled rows then verify one branch in the same tree-masked passes."""
    from test_tree import TreePolicy

    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, proposer="hybrid")
    decoder.policy = TreePolicy(seed=5)
    sampled, greedy, results = _shared_batch(decoder, setting, 13, greedy_prompt)
    assert sum(results[k].stats.tree_cycles for k in greedy) > 0, "no tree was verified: the test does not test trees"
    triples = np.array([results[k].tokens for k in sampled])
    return triples[:, 0] * VOCAB * VOCAB + triples[:, 1] * VOCAB + triples[:, 2], [results[k].tokens for k in greedy]


GREEDY_PROMPT = [2, 4, 7, 2, 4, 7, 2, 4]     # repeats itself: lookup proposes, so greedy rows get trees


def test_sampled_rows_beside_trees_match_the_target_distribution(models):
    """Trees are for greedy rows; sampled rows in the same passes stay exact (and greedy rows are
    the target's greedy output)."""
    target, draft = models
    setting = SETTINGS[0]
    cells, greedy = _rows_beside_trees(target, draft, setting, GREEDY_PROMPT)
    ids = torch.tensor([GREEDY_PROMPT], device=target.device)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3,
                               do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(GREEDY_PROMPT):].tolist()
    assert all(tokens == expected for tokens in greedy)
    assert chi_square_pvalue(cells, exact_joint(target, setting)) > ALPHA


def test_the_test_rejects_a_broken_rule_beside_trees(models, monkeypatch):
    target, draft = models
    monkeypatch.setattr(engine_module, "sample_accept", resample_from_p)
    cells, _ = _rows_beside_trees(target, draft, SETTINGS[0], GREEDY_PROMPT)
    pvalue = chi_square_pvalue(cells, exact_joint(target, SETTINGS[0]))
    assert pvalue < ALPHA, f"broken rule resample_from_p was not detected beside trees (p = {pvalue:.2e})"
