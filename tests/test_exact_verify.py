"""`--exact-verify`: verify passes that reproduce one-token steps, so greedy output is plain decoding's
token for token at bfloat16 and at float32 (dflash2's Llama on oneDNN's packed kernel); query-by-query
attention that computes attention; the refusals."""
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
from dflash2.targets import exact_attention
from dflash2.targets.exact_attention import attend, attention_invariant, batch_invariant

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
        out = attend(q, k, v, mask, d ** -0.5)
        assert torch.allclose(out, _reference(q, k, v, allowed, d ** -0.5), atol=1e-5)


def _pass_and_alone(groups: int, context: int, attention=attend) -> tuple[int, int]:
    """A pass of 8 queries per row (key counts crossing a width; row 1 left-padded with a
    hole; row 2 a token tree) through `attention`, against each query's one-token step through
    `attend` over its own keys: (queries that differ, queries)."""
    torch.manual_seed(0)
    b, length, d, kv = 3, 8, 64, 2
    slots = context + length
    # bfloat16 values held in float32: `attend` computes in float32, compared here before its rounding
    q = torch.randn(b, kv * groups, length, d).bfloat16().float()
    k, v = torch.randn(b, kv, slots, d).bfloat16().float(), torch.randn(b, kv, slots, d).bfloat16().float()
    allowed = (torch.arange(slots)[None, :] <= torch.arange(context, slots)[:, None]).repeat(b, 1, 1)   # [b, L, S]
    allowed[1, :, :9] = allowed[1, :, 12] = False                 # row 1: left padding and a rejected slot
    allowed[2, 3:, context + 1:context + 3] = False               # row 2: nodes 3.. branch off after node 0
    with exact_attention.exact():
        together = attention(q, k, v, allowed[:, None], d ** -0.5)
    differ = 0
    for r in range(b):
        for l in range(length):
            seen = allowed[r, l].nonzero().squeeze(-1)
            with exact_attention.exact():
                alone = attend(q[r:r + 1, :, l:l + 1], k[r:r + 1, :, seen], v[r:r + 1, :, seen], None, d ** -0.5)
            differ += not torch.equal(together[r:r + 1, :, l:l + 1], alone)
    return differ, b * length


@pytest.mark.parametrize("groups", [1, 3, 4])
@pytest.mark.parametrize("context", [60, 100, 190, 1020])   # counts cross 64; rows 0 and 1 of one width;
# crossing 192 (where MKL on an AMD EPYC reduces a query otherwise in a wider window); two key blocks
def test_each_query_of_a_pass_gets_its_one_token_steps_bits(groups, context):
    """Where the device probe says the kernel holds (the Intel Xeon with AMX: every case), every
    query of a pass has its one-token step's bits; where it says it does not (an AMD EPYC's MKL
    gives a row other bits as the call's row count or the row's place changes, groups 1 and 3),
    the pass really differs and `--exact-verify` is refused before the target loads."""
    holds, failed = attention_invariant(2, groups, 64, torch.bfloat16, "cpu")
    differ, queries = _pass_and_alone(groups, context)
    if holds:
        assert (differ, queries) == (0, 24)
    else:
        assert differ > 0 and "other bits than its one-token step" in failed
        config = LlamaConfig(hidden_size=64 * 2 * groups, num_attention_heads=2 * groups, num_key_value_heads=2,
                             intermediate_size=128, vocab_size=128, num_hidden_layers=1, head_dim=64)
        with pytest.raises(DFlash2Error, match="--exact-verify needs"):
            check_plan(config, "cpu", torch.bfloat16)


@pytest.mark.parametrize("rule, broken, groups", [
    ("bucket", lambda n: n, 3),        # windows of the keys a pass holds: no multiple of WIDTH
    ("MIN_ROWS", 1, 1),                # one-row calls (a tree's nodes, one query head per KV head)
])
def test_a_pass_that_breaks_a_rule_of_attend_is_caught(monkeypatch, rule, broken, groups):
    """The check above fails when a pass computes otherwise than `attend`'s one-token steps."""
    def pass_breaking_it(q, k, v, mask, scale):
        with monkeypatch.context() as patch:
            patch.setattr(exact_attention, rule, broken)
            with exact_attention.exact():         # its own plans
                return attend(q, k, v, mask, scale)
    differ, _ = _pass_and_alone(groups, 60, attention=pass_breaking_it)
    assert differ >= 8


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


def test_the_own_llama_at_float32_is_probed_on_the_kernel_it_multiplies_by(monkeypatch):
    """dflash2's Llama multiplies by oneDNN's packed kernel at float32 on a CPU: that kernel is probed
    (not MKL's `F.linear`), and one that rounds a row otherwise among others is still refused."""
    from dflash2.model import projections
    from dflash2.targets.llama import LlamaTargetConfig

    own = LlamaTargetConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                            vocab_size=49152, num_hidden_layers=2, head_dim=64)
    if not projections.can_pack(torch.zeros(1, 1)):
        pytest.skip("no oneDNN packing in this build")
    holds, _ = batch_invariant(linear_shapes(own), torch.float32, "cpu", packed=True)
    if holds:
        check_plan(own, "cpu", torch.float32)
    exact_kernel = projections.packed_product
    monkeypatch.setattr(projections, "packed_product", lambda x, w: exact_kernel(x, w) * (1 + 2 ** -20 * (x.shape[0] > 2)))
    with pytest.raises(DFlash2Error, match="float32 product of 3 rows rounds differently"):
        check_plan(own, "cpu", torch.float32)


def _exact_decoder(dtype: str):
    try:
        return load_decoder("smollm2", dtype=dtype, proposer="hybrid", exact_verify=True)
    except DFlash2Error as err:
        pytest.skip(f"--exact-verify does not hold here at {dtype}: {err}")


@pytest.fixture(scope="module")
def exact_bf16(smollm2_cache):
    return _exact_decoder("bfloat16")


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def exact(request, smollm2_cache):
    """bfloat16 (CPUs with avx512_bf16 / AMX) and float32 (dflash2's Llama on oneDNN's packed kernel)."""
    return _exact_decoder(request.param)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_output_is_plain_decodings_token_for_token(exact, batch):
    pipe = exact
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


def test_an_attention_kernel_that_is_not_query_invariant_is_refused(monkeypatch):
    plain = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                        vocab_size=128, num_hidden_layers=2)
    monkeypatch.setattr(exact_attention, "batch_invariant", lambda *a, **k: (True, ""))
    monkeypatch.setattr(exact_attention, "attention_invariant",
                        lambda *a, **k: (False, "attention over 70 keys gives a query of a 8-token pass other bits"))
    with pytest.raises(DFlash2Error, match="needs an attention kernel .* on this device \\(cpu\\) attention over 70 keys") as err:
        check_plan(plain, "cpu", torch.bfloat16)
    assert "\n" not in str(err.value)


def test_the_cli_refuses_exact_verify_where_it_cannot_hold_before_loading(monkeypatch, capsys):
    from dflash2 import pipeline
    from dflash2.cli import main

    monkeypatch.setattr(pipeline, "load_target_model", lambda *a, **k: pytest.fail("the target loaded"))
    monkeypatch.setattr("dflash2.decoding.verifier.exact.exact_attention.batch_invariant",
                        lambda *a, **k: (False, "a 576 x 576 float32 product of 2 rows"))
    assert main(["generate", "--prompt", "hi", "--exact-verify", "--dtype", "float32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --exact-verify needs batch-invariant matrix products")


def test_verify_pass_logits_equal_one_token_steps_bit_for_bit(exact):
    target = exact.decoder.target
    ids = encode_prompt(exact.tokenizer, PROMPTS[0])
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


def test_one_row_products_padded_into_the_verify_passes_kernel_class(exact_bf16, monkeypatch):
    """A one-token step multiplies as a verify pass's rows do: padded to `MIN_PRODUCT_ROWS` rows.
    Where the device's bfloat16 one-row product is a kernel of its own (an AMD EPYC without AMX:
    the 576 x 1536 down projection rounds some rows otherwise alone), dropping the padding is
    caught twice: the probe fails, and a one-token step's logits differ from a verify pass's."""
    shapes = [(576, 1536), (1536, 576)]
    assert batch_invariant(shapes, torch.bfloat16, "cpu")[0]        # the fixture loaded: the probe held
    monkeypatch.setattr(exact_attention, "MIN_PRODUCT_ROWS", 1)
    unpadded, failed = batch_invariant(shapes, torch.bfloat16, "cpu")
    if unpadded:
        pytest.skip("this CPU's bfloat16 one-row product is in the kernel class of 2..32 rows (AMX)")
    assert "576 x 1536 bfloat16 product" in failed
    target = exact_bf16.decoder.target
    ids = encode_prompt(exact_bf16.tokenizer, PROMPTS[1])
    following = list(range(2000, 2048))
    passes = {}
    for q in (1, 8):
        target.prefill([ids])
        logits = []
        for start in range(0, len(following), q):
            out, _ = target.step(torch.tensor([following[start:start + q]]))
            target.keep(torch.tensor([q]), q)
            logits.append(out)
        target.reset()
        passes[q] = torch.cat(logits, dim=1)
    assert not torch.equal(passes[1], passes[8])


def test_an_exact_target_model_copies_and_multiplies_as_before_outside_a_pass():
    """The batch-invariant products stay installed on the model: outside `exact()` a layer computes
    what it did before, and the model can still be deep-copied."""
    import copy
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)).to(torch.bfloat16)
    x = torch.randn(1, 16, dtype=torch.bfloat16)
    before = model(x)
    exact_attention.install_invariant_products(model)
    exact_attention.install_invariant_products(model)             # once: a second call changes nothing
    assert torch.equal(model(x), before)
    assert torch.equal(copy.deepcopy(model)(x), before)
    with exact_attention.exact():
        assert model(x).shape == before.shape
