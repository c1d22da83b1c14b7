"""`--exact-verify`: verify passes that reproduce one-token steps, so bfloat16 greedy output is plain
decoding's token for token; query-by-query attention that computes attention; the refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.exact import check_plan, linear_shapes
from dflash2.errors import DFlash2Error
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_prompt
from dflash2.targets.exact_attention import attend_per_query, batch_invariant

PROMPTS = ["Translate into French: the cat sleeps on the warm windowsill.",
           "A shop sells pencils at 3 for 1.20 dollars. How much do 20 pencils cost?",
           "Why do we have seasons on Earth?"]


def _reference(q, k, v, allowed, scale):
    """Plain attention, float64: q [b, h, L, d], k / v [b, kv, S, d], allowed [b, L, S] bool."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1).double(), v.repeat_interleave(groups, 1).double()
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return (scores.softmax(-1) @ v).float()


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4)])
def test_query_by_query_attention_is_attention(heads, kv_heads):
    torch.manual_seed(0)
    b, length, slots, d = 2, 5, 13, 8
    q, k, v = torch.randn(b, heads, length, d), torch.randn(b, kv_heads, slots, d), torch.randn(b, kv_heads, slots, d)
    causal = torch.arange(slots)[None, :] <= (slots - length + torch.arange(length))[:, None]       # [L, S]
    padded = causal[None].repeat(b, 1, 1)
    padded[1, :, :4] = False                                      # row 1: left padding
    holes = padded.clone()
    holes[0, :, 3] = holes[0, :, 6] = False                       # row 0: rejected slots of earlier cycles
    tree = padded.clone()
    tree[:, 2, slots - length + 1] = False                        # node 2 does not see node 1 (a sibling)
    for allowed, mask in ((causal[None].expand(b, -1, -1), None), (padded, padded[:, None]), (holes, holes[:, None]),
                          (tree, torch.zeros(tree.shape).masked_fill(~tree, torch.finfo(torch.float32).min)[:, None])):
        out = attend_per_query(q, k, v, mask, d ** -0.5)
        assert torch.allclose(out, _reference(q, k, v, allowed, d ** -0.5), atol=1e-5)


def test_recurrent_targets_and_products_that_are_not_batch_invariant_are_refused():
    hybrid = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         vocab_size=128, num_hidden_layers=4)
    hybrid.layer_types = ["linear_attention", "full_attention"] * 2
    with pytest.raises(DFlash2Error, match="attention-only target; this one has linear_attention layers"):
        check_plan(hybrid, "cpu", torch.bfloat16)
    plain = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                        vocab_size=49152, num_hidden_layers=2)
    holds, failed = batch_invariant(linear_shapes(plain), torch.float32, "cpu")
    if holds:
        check_plan(plain, "cpu", torch.float32)
    else:       # e.g. x86 CPUs: MKL's one-row float32 product is another kernel
        with pytest.raises(DFlash2Error, match=f"--exact-verify needs batch-invariant matrix products.*{failed}"):
            check_plan(plain, "cpu", torch.float32)


@pytest.fixture(scope="module")
def exact_bf16(smollm2_cache):
    try:
        return load_decoder("smollm2", dtype="bfloat16", proposer="hybrid", exact_verify=True)
    except DFlash2Error as err:
        pytest.skip(f"--exact-verify does not hold here: {err}")


@pytest.mark.parametrize("batch", [1, 3])
def test_bfloat16_greedy_output_is_plain_decodings_token_for_token(exact_bf16, batch):
    pipe = exact_bf16
    prompts = [encode_prompt(pipe.tokenizer, text) for text in PROMPTS]
    config = GenerationConfig(max_new_tokens=48, stop_token_ids=tuple(pipe.stop_token_ids))
    plain = SpeculativeDecoder(pipe.decoder.target)
    for proposer in ("hybrid", "draft", "lookup"):
        decoder, cycles = pipe.decoder_for(proposer).variant(speculate="always"), 0
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            ours = decoder.generate(chunk, config)
            assert [r.tokens for r in ours] == [r.tokens for r in plain.generate(chunk, config)], proposer
            cycles += sum(r.stats.cycles for r in ours)
        assert cycles > 0, proposer       # verify passes ran (a prompt may offer lookup nothing)


def test_the_cli_refuses_exact_verify_where_it_cannot_hold_before_loading(monkeypatch, capsys):
    from dflash2 import pipeline
    from dflash2.cli import main

    monkeypatch.setattr(pipeline, "load_target_model", lambda *a, **k: pytest.fail("the target loaded"))
    monkeypatch.setattr("dflash2.decoding.verifier.exact.exact_attention.batch_invariant",
                        lambda *a, **k: (False, "a 576 x 576 float32 product of 2 rows"))
    assert main(["generate", "--prompt", "hi", "--exact-verify", "--dtype", "float32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --exact-verify needs batch-invariant matrix products")


def test_verify_pass_logits_equal_one_token_steps_bit_for_bit(exact_bf16):
    target = exact_bf16.decoder.target
    ids = encode_prompt(exact_bf16.tokenizer, PROMPTS[0])
    following = list(range(1000, 1016))
    passes = {}
    for q in (1, 3, 8):
        target.prefill([ids])
        logits = []
        for start in range(0, len(following), q):
            chunk = following[start:start + q]
            out, _ = target.step(torch.tensor([chunk]))
            target.keep(torch.tensor([len(chunk)]), len(chunk))
            logits.append(out)
        target.reset()
        passes[q] = torch.cat(logits, dim=1)
    assert torch.equal(passes[1], passes[3]) and torch.equal(passes[1], passes[8])
    assert F.softmax(passes[1], -1).isfinite().all()
