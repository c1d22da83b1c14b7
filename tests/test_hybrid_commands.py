"""The draft workflow on a hybrid target directory (a tiny random Qwen3.5 saved with save_pretrained and a
character tokenizer): init-draft, generate --compare, regenerate (with the draft: the target's greedy
output), train (features tapped at linear-attention and attention layers alike), yardstick, bench,
analyze, the roll-back cost measurement and export in all three forms (dflash2, dflash-v1, gguf; the dflash2 export decodes the target
losslessly) run; a draft config in the shape of the published Qwen3.5 / Qwen3.8 drafts (block 16, five
taps at [5, 19, 33, 47, 61] of a 64-layer target, mask token 248070 of a 248,320-token vocabulary, the
target's head_dim and rope theta) loads and decodes a 64-layer tiny Qwen3.5 of that vocabulary."""
from __future__ import annotations

import json

import pytest
import torch
import yaml
from gguf import GGUFReader
from transformers import AutoModelForCausalLM

from dflash2.cli import main
from dflash2.data.shards import load_manifest, read_records
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.tools.profile import rollback
from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel
from dflash2.targets.kernels import use_kernels
from dflash2.targets.tiny import tiny_target
from matrix_util import tiny_tokenizer, train_config, write_shards
from test_export import _tokenizer_gguf
from test_lossless_hybrid import hf_greedy


@pytest.fixture(scope="module")
def workplace(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    target = tiny_target("qwen3_5")
    target.config.max_position_embeddings = 2048         # the yardstick's benchmark prompts, one token a character
    target.save_pretrained(root / "target")
    tiny_tokenizer().save_pretrained(root / "target")
    write_shards(root / "data", n=90)                         # records 73 and 86 are held out
    config = train_config(str(root / "target"), str(root / "data"), str(root / "run"))
    config["draft"]["target_layer_ids"] = [0, 3, 4]        # two Gated DeltaNet layers and the attention layer
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="module")
def draft(workplace):
    out = workplace / "draft"
    assert main(["init-draft", "--target", str(workplace / "target"), "--out", str(out), "--layers", "1"]) == 0
    return out


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_init_draft_and_generate_compare(workplace, draft, capsys):
    capsys.readouterr()
    assert main(["generate", "--target", str(workplace / "target"), "--draft", str(draft), "--prompt", "hello there",
                 "--max-new-tokens", "12", "--compare", "--speculate", "always", "--json", "--no-chat",
                 "--dtype", "float32"]) == 0
    assert last_json(capsys)["identical"] is True


def test_regenerate_with_the_draft_stores_the_targets_greedy_output(workplace, draft):
    out = workplace / "regen"
    assert main(["regenerate", "--target", str(workplace / "target"), "--draft", str(draft), "--out", str(out),
                 "--num-prompts", "3", "--max-new-tokens", "10", "--batch-size", "2", "--source", "synthetic",
                 "--no-progress", "--dtype", "float32"]) == 0
    stop = load_manifest(out)["sampling"]["stop_token_ids"]
    target = AutoModelForCausalLM.from_pretrained(workplace / "target", dtype=torch.float32).eval()
    records = list(read_records(out))
    assert len(records) == 3
    for record in records:
        assert record.response.tolist() == hf_greedy(target, record.prompt.tolist(), 10, eos=stop)


def test_analyze(workplace, draft):
    (workplace / "analyze-prompts.jsonl").write_text('{"prompt": "hello there"}\n')
    out = workplace / "analyze"
    assert main(["analyze", "--target", str(workplace / "target"), "--draft", str(draft), "--dataset-file",
                 str(workplace / "analyze-prompts.jsonl"), "--num-prompts", "1", "--max-new-tokens", "8",
                 "--repeats", "1", "--output", str(out), "--dtype", "float32"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert 1.0 <= results["acceptance"]["convs_on"]["argmax"] <= results["acceptance"]["convs_on"]["oracle"]
    assert results["latency"]["microbench_ms"]["cycle"] > 0


def test_train_yardstick_bench_export(workplace, capsys, monkeypatch):
    monkeypatch.chdir(workplace)
    assert main(["train", str(workplace / "train.yaml")]) == 0
    final = workplace / "run" / "final"
    assert json.loads((final / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [0, 3, 4]
    (workplace / "prompts.jsonl").write_text('{"prompt": "hello there"}\n{"prompt": "abc abc"}\n')
    assert main(["bench", "--target", str(workplace / "target"), "--draft", str(final), "--speculate", "always",
                 "--dataset-file", str(workplace / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "12",
                 "--concurrency", "1,2", "--output", str(workplace / "bench"), "--dtype", "float32"]) == 0
    results = json.loads((workplace / "bench" / "results.json").read_text())
    assert all(c["mismatches"] == 0 for c in results["overall"]["by_concurrency"].values())
    assert main(["yardstick", "--draft", str(final), "--target", str(workplace / "target"), "--data",
                 str(workplace / "data"), "--prompts", str(workplace / "yard-prompts.jsonl"), "--table",
                 str(workplace / "yard.md"), "--per-benchmark", "1", "--max-new-tokens", "8", "--dtype", "float32"]) == 0
    for form in ("dflash2", "dflash-v1"):
        extra = ["--measure-prompts", "1", "--measure-tokens", "8"] if form == "dflash-v1" else []
        assert main(["export", str(final), "--to", form, "--out", str(workplace / f"export-{form}"),
                     "--target", str(workplace / "target"), *extra]) == 0
    exported = DFlash2DraftModel.from_pretrained(workplace / "export-dflash2").eval()
    target = use_kernels(AutoModelForCausalLM.from_pretrained(workplace / "target", dtype=torch.float32).eval())
    decoder = SpeculativeDecoder(TargetAdapter(target, exported.config.target_layer_ids), exported, speculate="always")
    prompt = [1, 11, 8, 15, 15, 18]
    assert decoder.generate([prompt], GenerationConfig(max_new_tokens=16))[0].tokens == hf_greedy(target, prompt, 16)
    # gguf: the tokenizer comes from the target's own GGUF (llama.cpp converts the hybrid); a stand-in of its vocab
    vocab = _tokenizer_gguf(workplace / "target.gguf", target.config.vocab_size)
    assert main(["export", str(final), "--to", "gguf", "--out", str(workplace / "export-gguf"),
                 "--target", str(vocab)]) == 0
    reader = GGUFReader(str(workplace / "export-gguf" / "draft.gguf"))
    assert reader.fields["tokenizer.ggml.mask_token_id"].contents() == exported.config.mask_token_id
    assert len(reader.tensors) == len(exported.state_dict())


def test_rollback_cost_runs_on_the_hybrid(workplace, capsys):
    """`python -m dflash2.tools.profile.rollback`: one row per batch size, the target named as a hybrid."""
    out = workplace / "rollback.json"
    assert rollback.main(["--target", str(workplace / "target"), "--batch", "1,2", "--block", "4", "--repeats", "1",
                          "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["kind"], r["batch"], r["block"]) for r in rows] == [("hybrid", 1, 4), ("hybrid", 2, 4)]
    assert all(0.0 <= r["rollback_share"] < 1.0 and r["verify_over_plain"] > 0 for r in rows)
    assert "(hybrid)" in capsys.readouterr().out


def test_published_qwen35_draft_shape_loads_and_decodes():
    """The published drafts for the Qwen3.5 / Qwen3.8 hybrids (docs/spec.md: the Qwen3.8-27B one): block
    16, five taps at [5, 19, 33, 47, 61] of a 64-layer target (48 Gated DeltaNet + 16 attention layers
    here), mask token 248070 of the 248,320-token vocabulary, selector rank 256 / top 16, the target's
    head_dim and rope theta. Only the widths are tiny. A random draft: most drafts are rejected, so the
    recurrent state is rolled back nearly every cycle."""
    target = tiny_target("qwen3_5", vocab_size=248320, num_layers=64)
    text = target.config
    published = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False,
                 "hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size, "num_hidden_layers": 5,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": text.head_dim,
                 "vocab_size": text.vocab_size, "rms_norm_eps": 1e-6, "rope_theta": text.rope_parameters["rope_theta"],
                 "max_position_embeddings": 512, "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048,
                 "num_target_layers": text.num_hidden_layers, "tie_word_embeddings": False,
                 "dflash_config": {"block_size": 16, "target_layer_ids": [5, 19, 33, 47, 61], "mask_token_id": 248070,
                                   "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                                   "selector_top_k": 16}}
    config = DFlash2Config.from_dict(published)
    assert (config.block_size, config.target_layer_ids, config.mask_token_id) == (16, [5, 19, 33, 47, 61], 248070)
    assert {text.layer_types[i] for i in config.target_layer_ids} == {"linear_attention", "full_attention"}
    torch.manual_seed(0)
    draft = DFlash2DraftModel(config).eval()
    prompt = [5, 9, 11, 40, 248000, 17]
    expected = hf_greedy(target, prompt, 16)
    decoder = SpeculativeDecoder(TargetAdapter(target, config.target_layer_ids), draft, speculate="always")
    result = decoder.generate([prompt], GenerationConfig(max_new_tokens=16))[0]
    assert result.tokens == expected
    assert result.stats.acceptance_length < 16                     # rejections: rolled back mid-block
