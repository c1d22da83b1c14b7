"""A reduced-precision target's logits at float32 where they decide (decoding.verifier.full_logits)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflash2.decoding.verifier.full_logits import FullLogits
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.targets.exact_attention import batch_invariant
from dflash2.targets.tiny import tiny_target


def _bf16_target(vocab: int = 512):
    return tiny_target("llama", vocab_size=vocab, seed=3).to(torch.bfloat16)


def _near_ties(model, rows: int = 64) -> torch.Tensor:
    """Hidden states whose float32 logits have two tokens within 0.0005-0.03 of each other at the top."""
    weight = model.get_output_embeddings().weight.float()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, weight.shape[1], generator=generator) * 3
    for r in range(rows):
        a, step = torch.randint(weight.shape[0] - 1, (2,), generator=generator).tolist()
        b = (a + 1 + step) % weight.shape[0]                                    # another token than a
        x[r] += 40 * (weight[a] + weight[b]) / (weight[a] + weight[b]).norm()   # a and b on top
        d = weight[a] - weight[b]
        x[r] -= ((x[r] @ d) - 1e-3 * (r - rows / 2 + 0.5)) / (d @ d) * d      # z_a - z_b tiny, either sign
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_argmax_is_the_float32_heads_even_at_near_ties(dtype):
    model = tiny_target("llama", vocab_size=512, seed=3).to(dtype)
    full = FullLogits(model)
    head = model.get_output_embeddings()
    x = _near_ties(model)
    exact = F.linear(x, head.weight.float())                                    # the float32 head
    with full.installed():
        z = head(x)
    assert z.dtype == torch.float32
    assert torch.equal(z.argmax(-1), exact.argmax(-1))
    rounded = F.linear(x.to(dtype), head.weight).float()                       # the model's own head
    assert not torch.equal(rounded.argmax(-1), exact.argmax(-1))               # which the near-ties would fool
    top = exact.argmax(-1, keepdim=True)
    assert torch.allclose(z.gather(1, top), exact.gather(1, top), atol=1e-4, rtol=1e-5)
    assert 2 * x.shape[0] <= full.recomputed < x.shape[0] * 512 // 8            # a few tokens per row, not all


def test_rows_do_not_depend_on_the_pass_and_the_model_is_restored():
    """The float32 parts are per row; the head's own product is as batch-invariant as the device's kernel."""
    model = _bf16_target()
    if not batch_invariant([(512, 64)], torch.bfloat16, "cpu")[0]:
        pytest.skip("this CPU's bfloat16 products are not batch-invariant")
    full = FullLogits(model)
    head, norm = model.get_output_embeddings(), model.model.norm
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(9, 64, dtype=torch.bfloat16)
    with full.installed():
        together = head(norm(x[None]))[0]
        alone = torch.cat([head(norm(x[None, i:i + 1]))[0] for i in range(9)])
    assert torch.equal(together, alone)
    assert "forward" not in vars(head) and "forward" not in vars(norm)
    assert head(x).dtype == torch.bfloat16                                     # as loaded again
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_the_adapter_returns_float32_logits_and_a_float32_target_is_untouched():
    adapter = TargetAdapter(_bf16_target())
    logits, _ = adapter.prefill([[5, 6, 7]])
    assert adapter.full_logits.active and logits.dtype == torch.float32 and adapter.full_logits.recomputed > 0
    assert not TargetAdapter(tiny_target("llama", seed=3)).full_logits.active


def test_dflash2s_own_llama_gets_its_float32_logits_through_its_own_head_op():
    """The built-in Llama computes logits through a prepacked op over lm_head's weight, not lm_head:
    that op is what runs in the model's precision, and the argmax is the float32 head's."""
    from test_projections import _tiny      # dflash2's Llama, tiny, its weights spread

    model = _tiny(torch.bfloat16)
    own = vars(model)["head"]
    adapter = TargetAdapter(model)
    assert adapter.full_logits.active and adapter.full_logits.op_name == "head"
    x = _near_ties(model)
    exact = F.linear(x, model.lm_head.weight.float())
    with adapter.full_logits.installed():
        z = model.head(x)
        logits, _ = adapter.prefill([[5, 6, 7, 8]])
    assert z.dtype == torch.float32 and torch.equal(z.argmax(-1), exact.argmax(-1))
    assert logits.dtype == torch.float32 and logits.isfinite().all()
    assert vars(model)["head"] is own and model.head(x.to(torch.bfloat16)).dtype == torch.bfloat16   # restored


@pytest.mark.parametrize("vocab", [300, 320, 130])
def test_near_top_finds_what_a_whole_scan_finds(vocab):
    """The candidates the float32 head recomputes, found block by block (and in the last V mod 64
    tokens), are the (row, token) pairs a comparison of every logit finds: ties at the top, a second
    token near the top, a row with many, tokens on both sides of a block boundary."""
    from dflash2.decoding.verifier.full_logits import near_top

    generator = torch.Generator().manual_seed(1)
    z = torch.randn(40, vocab, generator=generator)
    z[5, 7] = z[5, 9] = 9.0                            # a tie at the top
    z[6, 3], z[6, vocab - 1] = 9.0, 8.99               # a second token near the top, in the last tokens
    z[7, 63], z[7, 64] = 9.0, 8.995                    # either side of a block boundary (blocks of 64 below)
    z[8] = 1.0                                          # every token at the top
    top = z.amax(dim=-1)
    for threshold in (top - torch.rand(40, generator=generator) * 0.8, top - 1e-6, top - 0.02):
        before = z.clone()
        got = list(zip(*(i.tolist() for i in near_top(z, threshold, block=64))))
        assert torch.equal(z, before)
        want = set(zip(*(i.tolist() for i in (z >= threshold[:, None]).nonzero(as_tuple=True))))
        assert sorted(got) == sorted(want) and len(got) == len(set(got))
        assert {(5, 7), (5, 9), (6, 3), (7, 63)} <= want and sum(1 for r, _ in got if r == 8) == vocab
        columns = z.t().contiguous().t()                 # the same values, stored column-major
        assert sorted(zip(*(i.tolist() for i in near_top(columns, threshold, block=64)))) == sorted(got)
