"""Hybrid targets (Gated DeltaNet / short-conv layers beside full attention) decode losslessly (fp32).

Every supported family (`tiny.HYBRID_FAMILIES`): greedy output equals Hugging Face `generate()` token
for token, batch 1 and 4 (prompts of different lengths, so left padding), blocks 2 to 16; drafts that
are right for a chosen number of positions and then wrong (every row rolls back to every block
position), always wrong, stop tokens mid-block, rows joining a running batch. And the state itself:
after `keep(counts)` each row's recurrent and conv state is the one that feeding only its accepted
tokens gives.
"""
from __future__ import annotations

import sys

import pytest
import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

from conftest import TEST_DEVICE, OracleDecoder, OracleProposer, with_speculation
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.proposers.draft import Proposal
from dflash2.decoding.verifier.recurrent import RecurrentLayer
from dflash2.targets.delta_rule import delta_rule_block
from dflash2.targets.kernels import use_kernels
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import HYBRID_FAMILIES, tiny_config, tiny_draft, tiny_target
from test_lossless_greedy import run_batched

NUM_PROMPTS = 8
NEW_TOKENS = 24


class Hybrids(dict):
    """family -> (target, draft, prompts, HF greedy outputs), each family built on first use."""

    def __missing__(self, family):
        target = tiny_target(family).to(TEST_DEVICE)
        g = torch.Generator().manual_seed(7)
        lengths = torch.randint(1, 20, (NUM_PROMPTS,), generator=g)
        prompts = [torch.randint(3, 127, (int(n),), generator=g).tolist() for n in lengths]
        self[family] = (target, tiny_draft(target).to(TEST_DEVICE), prompts, [hf_greedy(target, p) for p in prompts])
        return self[family]


@pytest.fixture(scope="module")
def hybrids():
    return Hybrids()


def hf_greedy(target, prompt: list[int], new_tokens: int = NEW_TOKENS, eos=None) -> list[int]:
    """The target's greedy continuation (with `eos`: up to and with the first of those ids)."""
    ids = torch.tensor([prompt], device=target.device)
    gen = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=1 if eos else new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return gen[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_random_draft_matches_hf_generate(hybrids, family, batch_size, block_size):
    target, draft, prompts, expected = hybrids[family]
    count = 2 if batch_size == 1 else NUM_PROMPTS
    decoder = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, speculate="always")
    results = run_batched(decoder, prompts[:count], GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=block_size),
                          batch_size)
    assert [r.tokens for r in results] == expected[:count]


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_adaptive_length_and_plain_steps_match_hf_generate(hybrids, family):
    """Random draft lengths each cycle, one cycle in five a plain one-token step."""
    target, draft, prompts, expected = hybrids[family]
    decoder = with_speculation(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), "random")
    results = run_batched(decoder, prompts, GenerationConfig(max_new_tokens=NEW_TOKENS, block_size=8), 4)
    assert [r.tokens for r in results] == expected


class ChosenCountProposer(OracleProposer):
    """Right for the first n drafts of a cycle, then wrong: row r accepts n = (r + cycle) % block
    drafts, so over the cycles every row is rolled back to every block position."""

    def __init__(self, sequences, vocab_size):
        super().__init__(sequences, vocab_size)
        self.cycle = 0
        self.chosen: set[int] = set()

    def propose(self, anchors, start_positions, block_size, temperature, seeds):
        right = super().propose(anchors, start_positions, block_size, temperature, seeds).tokens
        counts = (torch.arange(right.shape[0], device=right.device) + self.cycle) % block_size        # [b]
        wrong = (right + 1) % self.vocab_size
        self.cycle += 1
        self.chosen.update(counts.tolist())
        keep = torch.arange(right.shape[1], device=right.device)[None, :] < counts[:, None]
        return Proposal(torch.where(keep, right, wrong), None)


class ChosenCountDecoder(OracleDecoder):
    def generate(self, prompts, config):
        self.oracle = ChosenCountProposer([self.reference[tuple(p)] for p in prompts], self.target.vocab_size)
        return SpeculativeDecoder.generate(self, prompts, config)


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
@pytest.mark.parametrize("block_size", [4, 8])
def test_rows_rolled_back_to_every_block_position(hybrids, family, block_size):
    target, _, prompts, expected = hybrids[family]
    decoder = ChosenCountDecoder(TargetAdapter(target), prompts, expected, block_size)
    results = decoder.generate(prompts[:4], GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in results] == expected[:4]
    assert decoder.oracle.chosen == set(range(block_size))
    committed = {n for r in results for n in r.stats.committed_per_cycle[:-1]}     # the last cycle may be cut
    assert set(range(1, block_size)) <= committed        # n < block - 1 accepted: rolled back after n + 1


@pytest.mark.parametrize("family", HYBRID_FAMILIES + ("lfm2_moe",))
def test_batch_of_32_matches_hf_generate(hybrids, family):
    """32 rows in one batch (prompts of 1 to 8 tokens, 8 new tokens, block 4): an oracle draft makes row r
    accept (r + cycle) % 4 drafts, so in every cycle the rows roll back to different positions; on
    qwen3_5 the random tiny draft too."""
    target, draft, _, _ = hybrids[family]
    g = torch.Generator().manual_seed(32)
    prompts = [torch.randint(3, 127, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (32,), generator=g)]
    expected = [hf_greedy(target, p, 8) for p in prompts]
    config = GenerationConfig(max_new_tokens=8)
    decoder = ChosenCountDecoder(TargetAdapter(target), prompts, expected, 4)
    results = decoder.generate(prompts, config)
    assert [r.tokens for r in results] == expected
    assert {r.stats.committed_per_cycle[0] for r in results} == {1, 2, 3, 4}     # first cycle: 0..3 drafts kept
    if family == "qwen3_5":
        drafted = SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, speculate="always")
        assert [r.tokens for r in drafted.generate(prompts, GenerationConfig(max_new_tokens=8, block_size=4))] == expected


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_always_wrong_draft_gives_one_token_per_cycle(hybrids, family):
    target, _, prompts, expected = hybrids[family]
    decoder = OracleDecoder(TargetAdapter(target), prompts, expected, 8, wrong=True)
    results = decoder.generate(prompts[:4], GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in results] == expected[:4]
    assert all(r.stats.acceptance_length == 1.0 for r in results)


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2"])
def test_stop_tokens_mid_block(hybrids, family):
    target, draft, prompts, expected = hybrids[family]
    stop = expected[0][5]
    want = [e[: e.index(stop) + 1] if stop in e else e for e in expected]
    assert any(len(w) < NEW_TOKENS for w in want)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_token_ids=(stop,), block_size=8)
    for decoder in (SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft, speculate="always"),
                    OracleDecoder(TargetAdapter(target), prompts, expected, 8)):
        assert [r.tokens for r in run_batched(decoder, prompts, config, 4)] == want


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_rows_joining_a_running_batch(hybrids, family):
    """Continuous batching: two requests join every other cycle (their recurrent states merged into
    the batch's), others finish and leave."""
    target, draft, prompts, expected = hybrids[family]
    decoder = with_speculation(SpeculativeDecoder(TargetAdapter(target, draft.config.target_layer_ids), draft), "random")
    session, outputs, keys = decoder.session(), {}, {}
    lengths = [NEW_TOKENS, 5, NEW_TOKENS, 2, 11, NEW_TOKENS, 1, 9]
    waiting, cycle = list(range(NUM_PROMPTS)), 0
    while waiting or session:
        if waiting and cycle % 2 == 0:
            for i in waiting[:2]:
                keys[session.add([prompts[i]], GenerationConfig(max_new_tokens=lengths[i]))[0]] = i
            waiting = waiting[2:]
        for event in session.step():
            outputs.setdefault(keys[event.key], []).extend(event.tokens)
        cycle += 1
    assert [outputs[i] for i in range(NUM_PROMPTS)] == [expected[i][:n] for i, n in enumerate(lengths)]


def recurrent_state(adapter: TargetAdapter, row: int) -> list[torch.Tensor]:
    """Row `row`'s conv windows and recurrent states, layer by layer."""
    states = []
    for layer in adapter.cache.layers:
        if isinstance(layer, RecurrentLayer):
            states += [t[row] for t in (*layer.conv_states.values(), *layer.recurrent_states.values()) if t is not None]
    return states


@pytest.mark.parametrize("family", HYBRID_FAMILIES + ("lfm2_moe",))
@pytest.mark.parametrize("q", [1, 6])
def test_kept_state_equals_feeding_only_the_accepted_tokens(hybrids, family, q):
    """One step of q tokens on a batch of three prompts of different lengths, then each row keeps a
    different count (0..q): its state equals a lone prefill of the prompt followed by its kept tokens,
    and so do the logits of the next token. Fails if any recurrent or conv state is not rolled back."""
    target, _, prompts, _ = hybrids[family]
    rows = [prompts[0], prompts[1][:2], prompts[2]]
    tokens = torch.randint(3, 127, (3, q), generator=torch.Generator().manual_seed(1)).to(target.device)
    counts = torch.tensor([0, q // 2, q])
    batch = TargetAdapter(target)
    batch.prefill(rows)
    batch.step(tokens)
    batch.keep(counts, q)
    follow = torch.full((3, 1), 5, device=target.device)
    batch_logits, _ = batch.step(follow)
    for r, prompt in enumerate(rows):
        alone = TargetAdapter(target)
        alone.prefill([prompt + tokens[r, : int(counts[r])].tolist()])
        logits, _ = alone.step(follow[:1])
        torch.testing.assert_close(batch_logits[r], logits[0], atol=1e-4, rtol=1e-4)


def test_a_step_no_keep_followed_counts_as_all_kept(hybrids):
    """A recurrent layer that begins a new step with the last one's trail still pending (no `keep`)
    takes the state after all of its tokens, as `keep` of every token gives."""
    target, _, prompts, _ = hybrids["qwen3_5"]
    tokens = torch.randint(3, 127, (2, 5), generator=torch.Generator().manual_seed(4)).to(target.device)
    kept, pending = TargetAdapter(target), TargetAdapter(target)
    for adapter in (kept, pending):
        adapter.prefill([prompts[5], prompts[6]])
        adapter.step(tokens)
    kept.keep(torch.tensor([5, 5]), 5)
    for layer in pending.recurrent:
        layer.begin_step(1)
    for row in range(2):
        for got, want in zip(recurrent_state(pending, row), recurrent_state(kept, row), strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_a_rolled_back_state_is_the_accepted_prefix_state(hybrids):
    """The states themselves (not only the logits), on the qwen3_5 tiny target: batch step of 6, keep
    (1, 4); each row's state equals a lone adapter's that stepped the same kept tokens."""
    target, _, prompts, _ = hybrids["qwen3_5"]
    rows = [prompts[3], prompts[4]]
    tokens = torch.randint(3, 127, (2, 6), generator=torch.Generator().manual_seed(2)).to(target.device)
    counts = torch.tensor([1, 4])
    batch = TargetAdapter(target)
    batch.prefill(rows)
    batch.step(tokens)
    batch.keep(counts, 6)
    for r, prompt in enumerate(rows):
        alone = TargetAdapter(target)
        alone.prefill([prompt])
        n = int(counts[r])
        alone.step(tokens[r: r + 1, :n])
        alone.keep(torch.tensor([n]), n)
        for got, want in zip(recurrent_state(batch, r), recurrent_state(alone, 0), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grouped", [False, True])
def test_one_block_delta_rule_equals_the_token_by_token_rule(grouped):
    """`delta_rule_block` against transformers' recurrent (one token at a time) rule: the outputs of a
    block of 8, and the state after each n = 0..8 of its tokens rebuilt per row from the trail."""
    g = torch.Generator().manual_seed(3)
    b, q, heads, k_heads, k_dim, v_dim = 3, 8, 4, 2 if grouped else 4, 16, 8
    query, key = (torch.randn(b, q, k_heads, k_dim, generator=g) for _ in range(2))
    value = torch.randn(b, q, heads, v_dim, generator=g)
    decay, beta = -torch.rand(b, q, heads, generator=g), torch.rand(b, q, heads, generator=g)
    state = torch.randn(b, heads, k_dim, v_dim, generator=g)
    out, trail = delta_rule_block(query, key, value, decay, beta, state, True)

    def reference(n, rows=slice(None)):
        return torch_recurrent_gated_delta_rule(query[rows, :n], key[rows, :n], value[rows, :n], decay[rows, :n],
                                                beta[rows, :n], initial_state=state[rows], output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)

    want_out, want_final = reference(q)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trail.state_after(torch.full((b,), q)), want_final, atol=1e-5, rtol=1e-5)
    for n in range(q + 1):
        counts = torch.tensor([n, (n + 3) % (q + 1), q - n])
        rebuilt = trail.state_after(counts)
        for r, count in enumerate(counts.tolist()):
            want = reference(count, slice(r, r + 1))[1][0] if count else state[r]
            torch.testing.assert_close(rebuilt[r], want, atol=1e-5, rtol=1e-5)


def test_text_part_of_the_multimodal_model(hybrids):
    """Qwen3_5ForConditionalGeneration (vision tower unused): its text part decodes as generate()."""
    text = tiny_config("qwen3_5").to_dict()
    config = Qwen3_5Config(text_config=text, vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                                                  intermediate_size=32, out_hidden_size=64))
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).eval().to(TEST_DEVICE)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.25)
    use_kernels(model)                                   # built here, not loaded by dflash2.targets
    _, _, prompts, _ = hybrids["qwen3_5"]
    expected = [hf_greedy(model, p, 12) for p in prompts[:4]]
    decoder = OracleDecoder(TargetAdapter(model), prompts[:4], expected, 4)
    assert [r.tokens for r in decoder.generate(prompts[:4], GenerationConfig(max_new_tokens=12))] == expected


def test_a_hybrid_target_not_prepared_for_decoding_is_refused(hybrids, monkeypatch):
    """Without the capturing delta rule a verify pass would leave no trail to roll back with: the
    adapter refuses the model, naming `use_kernels` (which every dflash2 load applies)."""
    target = hybrids["qwen3_5"][0]
    layer = target.config.layer_types.index("linear_attention")
    module = sys.modules[type(target.model.layers[layer].linear_attn).__module__]
    routed = module.torch_chunk_gated_delta_rule
    monkeypatch.setattr(module, "torch_chunk_gated_delta_rule", routed.original)
    with pytest.raises(DFlash2Error, match=r"not prepared for decoding.*use_kernels"):
        TargetAdapter(target)
    assert TargetAdapter(use_kernels(target)).hybrid and module.torch_chunk_gated_delta_rule is not routed.original


def test_other_recurrent_layers_are_refused_naming_the_type(hybrids):
    target = tiny_target("llama")
    target.config.layer_types = ["mamba"] + ["full_attention"] * 5
    with pytest.raises(DFlash2Error, match=r"recurrent layers \(mamba\)"):
        TargetAdapter(target)
