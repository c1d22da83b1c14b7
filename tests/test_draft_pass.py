"""The draft pass's leaner pieces compute what the plain formulations compute: the path walk over
all predecessors at once, the convolution's broadcast coefficients and shift (padded, and in place
at inference), RoPE by one roll made once per pass for every layer, RMSNorm without casts at
inference; and a draft with packed projections (`model.packing`) proposes what its modules propose."""
from __future__ import annotations

import copy

import pytest
import torch

from dflash2.decoding.proposers.draft import DraftProposer
from dflash2.model.conv import GroupedDynamicConv
from dflash2.model.draft import apply_rope, rope_cos_sin
from dflash2.model.selector import CandidateSelector
from dflash2.runtime.rng import sample_from
from dflash2.targets.tiny import tiny_draft, tiny_target


def walk_one_row_at_a_time(scores, candidate_ids, temperature, u=None):
    """The walk as the contract states it: position by position from the pick before."""
    b, t_len, _, _ = scores.shape
    rows = torch.arange(b)
    temps = torch.as_tensor(temperature, dtype=torch.float32).expand(b)
    greedy = temps <= 0
    scale = torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    prev = torch.zeros(b, dtype=torch.long)
    picks, dists, confidence = [], [], []
    for t in range(t_len):
        row = scores[rows, t, prev].float()
        q = torch.softmax(row / scale, dim=-1)
        pick = torch.where(greedy, row.argmax(-1), sample_from(q, u[:, t])) if u is not None else row.argmax(-1)
        dists.append(q)
        confidence.append(q.gather(-1, pick[:, None])[:, 0])
        picks.append(pick)
        prev = pick
    picks = torch.stack(picks, 1)
    return candidate_ids.gather(-1, picks[..., None])[..., 0], torch.stack(dists, 1), torch.stack(confidence, 1)


@pytest.mark.parametrize("temperature", [0.0, 0.8, [0.0, 1.3, 0.0, 0.5]])
def test_walk_over_all_predecessors_at_once_is_the_row_by_row_walk(temperature):
    torch.manual_seed(0)
    b, t_len, k = 4, 7, 16
    scores = torch.randn(b, t_len, k, k) * 3
    scores[0, 2, :, 5] = scores[0, 2, :, 9] = 50.0           # a tie: the lower index wins
    candidate_ids = torch.randint(0, 1000, (b, t_len, k))
    sampled = temperature != 0.0
    u = torch.rand(b, t_len) if sampled else None
    path = CandidateSelector.walk(scores, candidate_ids, torch.tensor(temperature) if sampled else 0.0, u)
    tokens, q, confidence = walk_one_row_at_a_time(scores, candidate_ids, torch.tensor(temperature), u)
    assert torch.equal(path.tokens, tokens)
    assert torch.equal(path.confidence, confidence)
    assert (path.q is None) == (not sampled)
    if sampled:
        assert torch.equal(path.q, q)


def test_a_walk_that_follows_the_wrong_row_would_differ():
    """The oracle above tells walks apart: always reading predecessor row 0 gives another path."""
    torch.manual_seed(1)
    scores = torch.randn(2, 7, 16, 16) * 3
    ids = torch.arange(16).expand(2, 7, 16)
    wrong = ids.gather(-1, scores[:, :, 0].argmax(-1, keepdim=True))[..., 0]
    assert not torch.equal(CandidateSelector.walk(scores, ids, 0.0).tokens, wrong)


def test_convolution_coefficients_and_shift_match_the_per_channel_definition():
    torch.manual_seed(2)
    conv = GroupedDynamicConv(64, kernel_size=3, group_size=16)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(2, 3, 5, 64)
    dynamic = conv.kernel_projection(x).view(2, 3, 5, 2, 3, 4).repeat_interleave(16, dim=-1)
    coeffs = conv.base_kernel + dynamic
    assert torch.equal(conv.coefficients(x), coeffs)
    for side in (0, 1):
        expected = coeffs[..., side, 0, :] * x
        for tap in (1, 2):
            shifted = torch.zeros_like(x)
            shifted[..., tap:, :] = x[..., :-tap, :]
            expected = expected + coeffs[..., side, tap, :] * shifted
        assert torch.equal(conv.apply_side(x, coeffs, side), expected)
        with torch.inference_mode():   # the in-place form: the same values (torch.equal: -0.0 == 0.0)
            assert torch.equal(conv.apply_side(x, coeffs, side), expected)
    short = torch.randn(1, 1, 2, 64)   # a block no longer than the taps: the far tap sees only zeros
    assert conv.apply_side(short, conv.coefficients(short), 0).shape == short.shape
    with torch.inference_mode():
        expected = conv.coefficients(short)[..., 0, 0, :] * short
        expected[..., 1:, :] += conv.coefficients(short)[..., 1:, 0, 1, :] * short[..., :1, :]
        assert torch.equal(conv.apply_side(short, conv.coefficients(short), 0), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_without_gradients_gives_the_fp32_formulas_bits(dtype):
    """The draft's RMSNorm hands x to `F.rms_norm` in its own dtype at inference on the CPU: the bits
    of normalising in fp32 and rounding once, even for tapped features with norms in the thousands."""
    import torch.nn.functional as F

    from dflash2.model.draft import RMSNorm
    torch.manual_seed(4)
    norm = RMSNorm(576, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    for scale in (1e-3, 1.0, 3e3):
        x = (torch.randn(3, 8, 576) * scale).to(dtype)
        expected = F.rms_norm(x.float(), (576,), norm.weight.float(), 1e-5).to(dtype)
        with torch.inference_mode():
            got = norm(x)
        assert got.dtype == dtype and torch.equal(got, expected)


def test_rope_by_one_roll_is_rotate_half():
    torch.manual_seed(3)
    positions = torch.tensor([[0, 5, 17, 300]])
    x = torch.randn(1, 4, 3, 64)
    cos, sin = rope_cos_sin(positions, 64, 10000.0, torch.float32)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    angles = torch.cat([positions[..., None] * inv_freq] * 2, dim=-1)[..., None, :]
    rotated = torch.cat([-x[..., 32:], x[..., :32]], dim=-1)
    assert torch.equal(apply_rope(x, cos, sin), x * angles.cos() + rotated * angles.sin())


def test_attention_with_rope_shared_by_the_pass_is_plain_rope_attention():
    """q, k and v with rotate-half RoPE computed per tensor, against the draft's attention given one
    (cos, signed sin) for the whole pass."""
    import torch.nn.functional as F

    target = tiny_target("llama")
    attn = tiny_draft(target).layers[0].self_attn
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.normal_(1.0, 0.3)
    b, ctx_len, q_len, d = 1, 6, 8, attn.head_dim
    x, ctx = torch.randn(b, q_len, attn.q_proj.in_features), torch.randn(b, ctx_len, attn.q_proj.in_features)
    positions = torch.arange(ctx_len + q_len)[None]
    mask = torch.ones(b, 1, q_len, ctx_len + q_len, dtype=torch.bool)

    def rope(t, pos):   # rotate-half RoPE, [b, L, heads, d]
        inv = 1.0 / (attn_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.cat([pos[..., None] * inv] * 2, -1)[:, :, None]
        return t * ang.cos() + torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1) * ang.sin()

    attn_theta = tiny_draft(target).config.rope_theta
    def heads(t, n):
        return t.view(b, -1, n, d)
    q = rope(attn.q_norm(heads(attn.q_proj(x), attn.heads)), positions[:, ctx_len:]).transpose(1, 2)
    k = torch.cat([rope(attn.k_norm(heads(attn.k_proj(z), attn.kv_heads)), p) for z, p in
                   ((ctx, positions[:, :ctx_len]), (x, positions[:, ctx_len:]))], 1).transpose(1, 2)
    v = torch.cat([heads(attn.v_proj(z), attn.kv_heads) for z in (ctx, x)], 1).transpose(1, 2)
    expected = attn.o_proj(F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).reshape(b, q_len, -1))
    with torch.inference_mode():
        cos, sin = rope_cos_sin(positions, d, attn_theta, torch.float32)
        context = attn.key_value(ctx, (cos[:, :ctx_len], sin[:, :ctx_len]))
        got = attn(x, (cos[:, ctx_len:], sin[:, ctx_len:]), context, mask)
    assert torch.allclose(got, expected.detach(), atol=1e-5)


# ---------------------------------------------------------------- packed projections (`model.packing`)


def bound_tiny_draft(dtype, draft_vocab_size=None):
    target = tiny_target("llama")
    draft = tiny_draft(target, draft_vocab_size=draft_vocab_size)
    with torch.no_grad():   # norms of their own (a fresh draft's are ones: q's and k's alike)
        generator = torch.Generator().manual_seed(6)
        for name, param in draft.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=generator))
    draft = draft.to(dtype)
    draft.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    return draft


def run_cycles(draft, rows, temperature, seed=0):
    """A proposer's life on random target features: prefill `rows` rows (and merge two more), three
    proposals with appends between them (uneven counts leave holes), the last with the lattice."""
    generator = torch.Generator().manual_seed(seed)
    width = draft.config.num_taps * draft.config.target_hidden_size
    vocab = draft.config.vocab_size

    def features(b, length):
        return (torch.randn(b, length, width, generator=generator) * 3).to(draft.fc.weight.dtype)

    proposer = DraftProposer(draft, lattice=True)
    mask = torch.ones(rows, 12, dtype=torch.long)
    mask[0, :4] = 0                                                     # a left-padded row
    proposer.add_rows(features(rows, 12), mask)
    proposer.add_rows(features(2, 9), torch.ones(2, 9, dtype=torch.long))
    b = rows + 2
    start = torch.cat([mask.sum(-1), torch.full((2,), 9)])
    temps = torch.tensor([temperature if r % 2 else 0.0 for r in range(b)])
    seeds = torch.arange(b) + 11
    out = []
    for cycle in range(3):
        anchors = torch.randint(0, vocab - 1, (b,), generator=generator)
        out.append(proposer.propose(anchors, start, draft.config.block_size, temps, seeds))
        counts = torch.randint(1, draft.config.block_size + 1, (b,), generator=generator)
        proposer.append(features(b, draft.config.block_size), counts, start, defer=cycle == 1)
        start = start + counts
    return out


def same_proposals(a, b, bits=True):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.tokens, y.tokens)
        if bits:
            assert torch.equal(x.confidence, y.confidence)
            assert (x.q is None) == (y.q is None) and (x.q is None or torch.equal(x.q, y.q))
            assert (x.second is None) == (y.second is None)
            if x.second is not None:
                assert torch.equal(x.second.tokens, y.second.tokens) and torch.equal(x.second.fork, y.second.fork)
                assert torch.equal(x.second.confidence, y.second.confidence)


def packs_of(draft):
    """The draft's inference packs (`model.packing.Packed`), after `pack()`."""
    from dflash2.model.packing import Packed
    return [v for m in draft.modules() for v in vars(m).values() if isinstance(v, Packed)]


def close_proposals(a, b):
    """The same tokens, and confidences (and sampling distributions) equal to rounding."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.tokens, y.tokens)
        torch.testing.assert_close(x.confidence, y.confidence, rtol=1e-4, atol=1e-5)
        assert (x.q is None) == (y.q is None)
        if x.q is not None:
            torch.testing.assert_close(x.q, y.q, rtol=1e-4, atol=1e-5)
        assert (x.second is None) == (y.second is None)
        if x.second is not None:
            assert torch.equal(x.second.tokens, y.second.tokens) and torch.equal(x.second.fork, y.second.fork)


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("draft_vocab_size", [None, 40])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_packed_draft_proposes_the_modules_proposals_in_float32(rows, draft_vocab_size, temperature):
    """float32 drafts run oneDNN's packed kernel too: the modules' tokens, their values to rounding
    (the packed float32 kernel sums in another order than MKL's `F.linear`)."""
    packed = bound_tiny_draft(torch.float32, draft_vocab_size)
    plain = copy.deepcopy(packed)
    plain.packing = False
    got, expected = run_cycles(packed, rows, temperature), run_cycles(plain, rows, temperature)
    assert packed.layers[0].self_attn.packed_qkv.projection.packed is not None
    assert plain.layers[0].self_attn.packed_qkv is None
    close_proposals(got, expected)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_packed_draft_proposes_the_modules_proposals_bit_for_bit_in_bfloat16_at_batch_one(temperature):
    """oneDNN's packed kernel up to `projections.SAME_BITS_ROWS` rows gives `F.linear`'s bits
    (batch 1 + 2 merged rows: 24 rows a pass)."""
    packed = bound_tiny_draft(torch.bfloat16, 40)
    plain = copy.deepcopy(packed)
    plain.packing = False
    same_proposals(run_cycles(packed, 1, temperature), run_cycles(plain, 1, temperature))


def batch_against_rows_alone(draft, rows=8, temperature=0.0):
    """How many rows of one batch-`rows` proposal differ (tokens or confidence bits) from that row's
    proposal alone over the same context (`select_rows` of the same proposer)."""
    generator = torch.Generator().manual_seed(5)
    width = draft.config.num_taps * draft.config.target_hidden_size
    proposer = DraftProposer(draft)
    proposer.add_rows((torch.randn(rows, 10, width, generator=generator) * 3).to(draft.fc.weight.dtype),
                      torch.ones(rows, 10, dtype=torch.long))
    anchors = torch.randint(0, draft.config.vocab_size - 1, (rows,), generator=generator)
    start = torch.full((rows,), 10)
    temps, seeds = torch.full((rows,), temperature), torch.arange(rows)
    whole = proposer.propose(anchors, start, draft.config.block_size, temps, seeds)
    differ = 0
    for r in range(rows):
        alone = copy.copy(proposer)
        alone.select_rows(torch.tensor([r]))
        one = alone.propose(anchors[r:r + 1], start[r:r + 1], draft.config.block_size, temps[r:r + 1], seeds[r:r + 1])
        differ += not (torch.equal(one.tokens, whole.tokens[r:r + 1])
                       and torch.equal(one.confidence, whole.confidence[r:r + 1]))
    return differ


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_packed_draft_in_bfloat16_proposes_for_each_row_of_a_batch_what_it_proposes_alone(temperature):
    """Beyond `SAME_BITS_ROWS` (batch 8: 64 rows a pass) `F.linear` changes algorithm and a row's
    bits depend on its batch; the packed kernel keeps the one-row bits (the row alone: 8 rows)."""
    draft = bound_tiny_draft(torch.bfloat16, 40)
    assert batch_against_rows_alone(draft, temperature=temperature) == 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_packed_draft_in_float32_proposes_for_each_row_of_a_batch_what_it_proposes_alone(temperature):
    """Where the float32 packed layout is row-invariant for every weight of the draft (the probe
    `projections.row_invariant`), a batch's rows propose bit for bit what they propose alone."""
    draft = bound_tiny_draft(torch.float32, 40)
    draft.pack()
    packs = packs_of(draft)
    assert packs and all(p.projection.packed is not None for p in packs)
    if not all(p.projection.invariant for p in packs):
        pytest.skip("oneDNN's float32 packed layout is not row-invariant on this CPU")
    assert batch_against_rows_alone(draft, temperature=temperature) == 0


def test_packing_leaves_parameters_and_training_alone_and_a_changed_weight_is_not_served_stale():
    draft = bound_tiny_draft(torch.float32)
    params = dict(draft.named_parameters())
    state = {n: t.clone() for n, t in draft.state_dict().items()}
    draft.pack()
    assert all(p is params[n] for n, p in draft.named_parameters())
    assert draft.state_dict().keys() == state.keys()
    features = torch.randn(1, 5, draft.fc.in_features)
    positions = torch.arange(5)[None]
    with torch.no_grad():
        draft.fc.weight.mul_(2.0)                  # an optimiser step would change it in place too
        draft.layers[0].self_attn.k_proj.weight.add_(0.5)
    reference = copy.deepcopy(draft)
    reference.packing = False
    reference.pack()
    with torch.inference_mode():
        for (k, v), (rk, rv) in zip(draft.context_kv(features, positions), reference.context_kv(features, positions)):
            assert torch.equal(k, rk) and torch.equal(v, rv)
    context = draft.context_kv(features, positions)  # with gradients: the modules' own matmuls
    positions = torch.arange(5, 13).view(1, 1, 8)
    from dflash2.model.mask import block_visibility
    hidden = draft.forward_blocks(torch.zeros(1, 1, 8, dtype=torch.long), positions, context,
                                  block_visibility(positions, torch.arange(5)[None], None))
    hidden.sum().backward()
    assert draft.layers[0].self_attn.q_proj.weight.grad is not None
    assert draft.layers[0].mlp.gate_proj.weight.grad is not None


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_shipped_draft_packed_proposes_the_same(smollm2_cache, dtype):
    """The shipped draft on SmolLM2's own features of eight chat prompts: alone, the modules' own
    tokens (a prompt's 35-60 context rows project on the packed kernel, which rounds its own way
    there, so the confidences may differ in their last bits); as one batch, each row what it
    proposes alone, which the modules' own matmuls do not always give: on the Intel Xeon with AMX
    their rounding changes with the batch's size (7 of 8 rows differed), on an AMD EPYC without AMX
    it does not, so only the packed kernel's invariance is asserted (in float32 where the probe
    finds the layout row-invariant for every projection)."""
    from dflash2.model.projections import can_pack
    from dflash2.pipeline import load_decoder
    from dflash2.targets.chat import encode_prompt

    pipe = load_decoder("smollm2", dtype=dtype, draft_dtype=dtype, proposer="draft")
    adapter, packed = pipe.decoder.target, pipe.decoder.draft
    plain = copy.deepcopy(packed)
    plain.packing = False
    prompts = ["Explain in three sentences why the sky is blue.", "Write a haiku about autumn rain.",
               "What is 17 times 23? Show your steps.", "Translate 'good morning, friend' into French.",
               "Give me a Python function that reverses a string.", "Summarise the plot of Hamlet briefly.",
               "List three uses of baking soda.", "How do vaccines train the immune system?"]
    ids = [encode_prompt(pipe.tokenizer, p) for p in prompts]
    for prompt in ids:
        _, features = adapter.prefill([prompt])
        anchors = torch.tensor([prompt[-1]])
        tokens = []
        for draft in (packed, plain):
            proposer = DraftProposer(draft)
            proposer.add_rows(features, adapter.mask)
            proposal = proposer.propose(anchors, adapter.next_position.clone(), draft.config.block_size)
            tokens.append(proposal.tokens)
        assert torch.equal(tokens[0], tokens[1])
    packs = packs_of(packed)
    assert packs and all((p.projection.packed is not None) == can_pack(p.projection.weight) for p in packs)
    if dtype == "float32" and not all(p.projection.invariant for p in packs):
        return                 # the kernel rounds by row count on this CPU: a batch may propose otherwise
    _, features = adapter.prefill(ids)
    anchors, start = torch.tensor([p[-1] for p in ids]), adapter.next_position.clone()
    proposer = DraftProposer(packed)
    proposer.add_rows(features, adapter.mask)
    whole = proposer.propose(anchors, start, packed.config.block_size)
    for r in range(len(ids)):
        alone = copy.copy(proposer)
        alone.select_rows(torch.tensor([r]))
        one = alone.propose(anchors[r:r + 1], start[r:r + 1], packed.config.block_size)
        assert torch.equal(one.tokens, whole.tokens[r:r + 1]) and torch.equal(one.confidence, whole.confidence[r:r + 1])
