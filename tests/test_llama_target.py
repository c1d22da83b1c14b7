"""dflash2's own Llama (`targets.llama`) computes what transformers' `LlamaForCausalLM` computes, so
a target loaded through it gives the same logits, the same greedy output and the same data
fingerprints; which configs it takes; and that the default start-up no longer imports
transformers' Llama modules."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
from transformers.cache_utils import DynamicCache

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.proposers.tree import pack_tree
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.targets import builtin, llama
from dflash2.training.data_identity import config_sha256, target_fields

ROUNDING = 5e-5   # fp32 logits: the same arithmetic summed in another order (measured 1.2e-5)


def _tiny_llama_dir(tmp_path, **overrides):
    """A random 4-layer Llama (GQA 4 heads / 2 KV heads, tied head) saved as a target directory."""
    fields = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True)
    fields.update(overrides)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**fields), dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.3)
    model.save_pretrained(tmp_path)
    return tmp_path


def _both(directory, dtype=torch.float32):
    own = llama.LlamaCausalLM.from_pretrained(directory, llama.LlamaTargetConfig.from_json(directory), dtype)
    theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    return own, theirs


def test_supports_only_what_it_computes_exactly(tmp_path):
    base = json.loads((_tiny_llama_dir(tmp_path) / "config.json").read_text())
    assert llama.supports(base)
    for change in ({"model_type": "qwen3"}, {"attention_bias": True}, {"mlp_bias": True}, {"hidden_act": "gelu"},
                   {"pretraining_tp": 2}, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
                   {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
                   {"architectures": ["LlamaForSequenceClassification"]}):
        assert not llama.supports({**base, **change}), change


def test_config_matches_transformers_field_for_field(tmp_path):
    directory = _tiny_llama_dir(tmp_path)
    ours = llama.LlamaTargetConfig.from_json(directory)
    theirs = AutoConfig.from_pretrained(directory)          # what open_target read before
    assert ours.to_dict() == theirs.to_dict()
    assert config_sha256(ours) == config_sha256(theirs)   # regenerated data keeps matching its target
    assert len(DynamicCache(config=ours).layers) == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_equal_transformers_with_padding_cache_and_trees(tmp_path, dtype):
    own, theirs = _both(_tiny_llama_dir(tmp_path), dtype)
    assert sorted(own.state_dict()) == sorted(theirs.state_dict())
    assert target_fields("t", own) == target_fields("t", theirs)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (3, 11), generator=generator)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :7] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    steps = [torch.randint(0, 96, (3, q), generator=generator) for q in (5, 1, 2)]
    outputs = []
    for model in (own, theirs):
        cache, seen, run = DynamicCache(config=theirs.config), mask, []
        with torch.inference_mode():
            run.append(model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             use_cache=True, logits_to_keep=1).logits)
            run.append(model(input_ids=ids[:1], use_cache=False).logits)            # no cache, no mask
            for step in steps:
                q = step.shape[1]
                seen = torch.cat([seen, torch.ones(3, q, dtype=torch.long)], dim=1)
                step_positions = seen.sum(-1, keepdim=True) - q + torch.arange(q)
                run.append(model(input_ids=step, attention_mask=seen, position_ids=step_positions,
                                 past_key_values=cache, use_cache=True).logits)
        outputs.append(run)
    for ours, reference in zip(*outputs):    # rounding only: our GQA folds the query heads onto the KV
        torch.testing.assert_close(ours, reference, rtol=0, atol=ROUNDING)   # heads, transformers repeats the KV
    # a 4-D mask (a token tree through the adapter) as well
    logits = []
    for model in (own, theirs):
        adapter = TargetAdapter(model, [1, 2])
        adapter.prefill([[5, 6, 7], [8, 9]])
        tree = pack_tree([1, 5], [[[2, 4], [3]], [[6, 7], [6, 8, 9]]], 6, "cpu")   # two branches a row
        logits.append(adapter.step_tree(tree.ids, tree.depth, tree.visible))
    torch.testing.assert_close(logits[0][0], logits[1][0], rtol=0, atol=ROUNDING)
    torch.testing.assert_close(logits[0][1], logits[1][1], rtol=0, atol=ROUNDING)


def test_a_broken_mask_would_show(tmp_path):
    """The comparison above can fail: attending to the padding changes the padded rows' logits."""
    own, theirs = _both(_tiny_llama_dir(tmp_path))
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        right = own(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        wrong = own(input_ids=ids, attention_mask=torch.ones_like(mask), position_ids=positions).logits
        reference = theirs(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(right, reference, rtol=0, atol=ROUNDING)
    assert (wrong[1, -1] - reference[1, -1]).abs().max() > 1e-2


def test_engine_greedy_output_is_transformers_generate(tmp_path):
    """Lossless against the target's own decoding: the engine on dflash2's Llama, block verification
    with an oracle-free random draft path (speculate always), equals HF `generate()` token for token."""
    own, theirs = _both(_tiny_llama_dir(tmp_path))
    prompts = [[3, 17, 42, 8], [60, 2], [11, 12, 13, 14, 15, 16]]
    config = GenerationConfig(max_new_tokens=24, stop_token_ids=())
    from dflash2.targets.tiny import tiny_draft

    draft = tiny_draft(theirs, seed=2)
    ours = SpeculativeDecoder(TargetAdapter(own, draft.config.target_layer_ids), draft, speculate="always")
    results = ours.generate(prompts, config)
    for prompt, result in zip(prompts, results):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            reference = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                        min_new_tokens=24, do_sample=False, pad_token_id=0)
        assert result.tokens == reference[0, len(prompt):].tolist()
    assert sum(r.stats.cycles for r in results) < 3 * 24   # it verified blocks, not one token a pass


def _with_tokenizer(directory, converted):
    """A real tokenizer beside the tiny weights (open_target reads one)."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(converted / name, directory / name)
    return directory


def test_open_target_chooses_the_class(tmp_path, smollm2_cache):
    def with_tokenizer(directory):
        return _with_tokenizer(directory, smollm2_cache[1])

    directory = with_tokenizer(_tiny_llama_dir(tmp_path / "llama"))
    assert isinstance(builtin.open_target(str(directory)).config, llama.LlamaTargetConfig)
    assert type(builtin.open_target(str(directory), "transformers").config) is LlamaConfig
    assert isinstance(builtin.load_target_model(builtin.open_target(str(directory))), llama.LlamaCausalLM)
    other = with_tokenizer(_tiny_llama_dir(tmp_path / "scaled",
                                           rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}))
    assert type(builtin.open_target(str(other)).config) is LlamaConfig     # not computed here: transformers
    with pytest.raises(DFlash2Error, match="implementation must be one of auto, transformers"):
        builtin.open_target(str(directory), "fast")


def test_the_default_start_up_skips_transformers_llama_modules(smollm2_cache):
    """What makes `generate` start in seconds: neither transformers' Llama modules nor torch._dynamo
    (1.5-2 s of imports) load for the built-in SmolLM2 target and its shipped draft."""
    cache, _ = smollm2_cache
    code = ("import sys; from dflash2.pipeline import load_decoder; pipe = load_decoder('smollm2'); "
            "print(type(pipe.decoder.target.model).__name__, "
            "[m for m in ('transformers.models.llama.modeling_llama', 'transformers.models.llama.configuration_llama', "
            "'torch._dynamo') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DFLASH2_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "LlamaCausalLM []"


def test_a_target_without_a_trained_draft_gets_lookup_by_default(tmp_path, smollm2_cache):
    """An untrained draft cannot pay (tau 1.0), lookup can (BENCHMARKS.md sections 1 and 7.1): that is the
    default for a target no trained draft ships for; asking for the draft still gives one."""
    from dflash2.pipeline import prepare_decoder

    directory = str(_with_tokenizer(_tiny_llama_dir(tmp_path), smollm2_cache[1]))
    plan = prepare_decoder(directory)
    assert plan.proposer == "lookup" and plan.draft is None and "no trained draft ships" in plan.description
    pipe = plan.load()
    assert pipe.decoder.draft is None and pipe.decoder.proposer == "lookup"
    asked = prepare_decoder(directory, proposer="draft")
    assert asked.proposer == "draft" and asked.description.startswith("untrained DFlash2 draft")
    assert prepare_decoder(directory, no_draft=True).proposer is None            # --no-draft: plain decoding
