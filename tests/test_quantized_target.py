"""A target run on weight-only quantized layers (`--weights int8|int4`, `pipeline.check_weights`):
refused in one line where it cannot run, before any weights load; lossless against that quantized
target (greedy speculative output equals its plain decoding); recorded in headers and results;
and audited against the quantized weights, not the float ones."""
from __future__ import annotations

import pytest
import torch

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.eval.audit import audit, reference_loader
from dflash2.pipeline import prepare_decoder
from dflash2.runtime.devices import native_bfloat16
from dflash2.model import projections
from dflash2.targets import llama
from dflash2.targets.tiny import tiny_draft
from tests.test_llama_target import _both, _tiny_llama_dir, _with_tokenizer

NATIVE, WHY = native_bfloat16("cpu")
needs_native_bf16 = pytest.mark.skipif(not NATIVE, reason=f"bfloat16 is emulated here ({WHY})")
SHAPE = dict(intermediate_size=128)          # every layer size a multiple of int4's group of 32


@pytest.fixture
def target_dir(tmp_path, smollm2_cache):
    return str(_with_tokenizer(_tiny_llama_dir(tmp_path / "llama", **SHAPE), smollm2_cache[1]))


def test_what_cannot_run_quantized_is_refused_in_one_line_before_loading(tmp_path, target_dir, smollm2_cache,
                                                                        monkeypatch):
    loads = []
    monkeypatch.setattr("dflash2.pipeline.load_target_model", lambda *a, **k: loads.append(a))
    with pytest.raises(DFlash2Error, match=r"--weights int4 computes with bfloat16 activations .* give --dtype bfloat16"):
        prepare_decoder(target_dir, dtype="float32", weights="int4", proposer="lookup")
    with pytest.raises(DFlash2Error, match="--weights must be one of float, int8, int4, got 'int2'"):
        prepare_decoder(target_dir, dtype="bfloat16", weights="int2", proposer="lookup")
    odd = str(_with_tokenizer(_tiny_llama_dir(tmp_path / "odd"), smollm2_cache[1]))      # MLP width 112
    with pytest.raises(DFlash2Error, match=r"--weights int4 needs layer input sizes divisible by 32"):
        prepare_decoder(odd, dtype="bfloat16", weights="int4", proposer="lookup")
    assert prepare_decoder(odd, dtype="bfloat16", weights="int8", proposer="lookup").precision.weights == "int8"
    other = str(_with_tokenizer(_tiny_llama_dir(tmp_path / "scaled", **SHAPE, rope_parameters={
        "rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}), smollm2_cache[1]))   # transformers' classes
    with pytest.raises(DFlash2Error, match="quantizes dflash2's own Llama .* runs transformers' Llama classes"):
        prepare_decoder(other, dtype="bfloat16", weights="int4", proposer="lookup")
    assert loads == []


@needs_native_bf16
@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_greedy_speculation_on_a_quantized_target_is_its_plain_decoding(tmp_path, scheme):
    """Each verify pass's rows are computed as the one-token step computes them (the weight-only
    kernels are row-invariant; `--exact-verify` the attention), so greedy output is the quantized
    target's token for token; and it is another model than the float one."""
    own, theirs = _both(_tiny_llama_dir(tmp_path, **SHAPE), torch.bfloat16)
    float_model = llama.LlamaCausalLM.from_pretrained(str(tmp_path), own.config, torch.bfloat16)
    projections.set_weights(own, scheme)
    assert projections.weights_of(own) == scheme and projections.weights_of(float_model) == "float"
    prompts = [[3, 17, 42, 8], [60, 2], [11, 12, 13, 14, 15, 16]]
    config = GenerationConfig(max_new_tokens=24, stop_token_ids=())
    draft = tiny_draft(theirs.float(), seed=2).to(torch.bfloat16)
    adapter = TargetAdapter(own, draft.config.target_layer_ids, exact_verify=True)
    plain = SpeculativeDecoder(adapter).generate(prompts, config)
    speculative = SpeculativeDecoder(adapter, draft, speculate="always").generate(prompts, config)
    lookup = SpeculativeDecoder(adapter, speculate="always", proposer="lookup").generate(prompts, config)
    assert [r.tokens for r in speculative] == [r.tokens for r in plain] == [r.tokens for r in lookup]
    assert sum(r.stats.cycles for r in speculative) < 3 * 24          # blocks were verified, not single tokens
    with torch.inference_mode():
        ids = torch.tensor([prompts[2]])
        assert not torch.equal(own(input_ids=ids).logits, float_model(input_ids=ids).logits)


@needs_native_bf16
def test_the_audit_refers_a_quantized_target_to_its_own_weights(target_dir):
    """A mismatch is judged on the quantized weights at float32 (what plain decoding and speculation
    must agree on): those logits sit within bfloat16's rounding of the int4 target's, while the float
    target's differ by more; and a token the target did not choose comes out as a defect."""
    pipe = prepare_decoder(target_dir, dtype="bfloat16", weights="int4", proposer="lookup").load()
    assert pipe.precision.weights == "int4" and "int4 weights" in pipe.header()
    assert pipe.precision.record()["weights"] == "int4"
    reference = reference_loader(pipe)()
    assert next(reference.model.parameters()).dtype == torch.float32
    ids = [3, 17, 42, 8, 60, 2, 11]
    with torch.inference_mode():
        quantized = pipe.decoder.target.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    float_plan = prepare_decoder(target_dir, dtype="float32", proposer="lookup").load()
    with torch.inference_mode():
        unquantized = float_plan.decoder.target.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    z = reference.logits(ids)
    assert (z - quantized).abs().max() < (z - unquantized).abs().max()
    best, worst = int(z.argmax()), int(z.argmin())
    found = audit([(ids, [best], [worst])], lambda: reference, "bfloat16")
    assert found.defects == 1 and found.worst_margin == pytest.approx(float(z[best] - z[worst]), rel=1e-6)


def test_the_commands_take_the_option_and_refuse_float_peers_for_a_quantized_target(tmp_path, capsys):
    from dflash2.cli import main

    assert main(["bench", "--tiny", "--weights", "int4", "--peers", "hf", "--output", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --peers run the target's float weights, and --weights int4 benchmarks a quantized target; "
                   "drop one of them"]
    assert main(["generate", "--prompt", "hi", "--weights", "int3"]) == 2
    assert "--weights" in capsys.readouterr().err and not (tmp_path / "b").exists()
