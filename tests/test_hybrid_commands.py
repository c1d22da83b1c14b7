"""The draft workflow on a hybrid target directory (a tiny random Qwen3.5 saved with save_pretrained and a
character tokenizer): init-draft, generate --compare, train (features tapped at linear-attention and
attention layers alike), yardstick, bench and export (dflash2, dflash-v1) run and stay lossless; a draft config in the shape
the published Qwen3.5 drafts use loads and decodes."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from dflash2.cli import main
from dflash2.decoding.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier import TargetAdapter
from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel
from dflash2.targets.tiny import tiny_target
from matrix_util import tiny_tokenizer, train_config, write_shards


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


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_init_draft_and_generate_compare(workplace, capsys):
    draft = workplace / "draft"
    assert main(["init-draft", "--target", str(workplace / "target"), "--out", str(draft), "--layers", "1"]) == 0
    capsys.readouterr()
    assert main(["generate", "--target", str(workplace / "target"), "--draft", str(draft), "--prompt", "hello there",
                 "--max-new-tokens", "12", "--compare", "--speculate", "always", "--json", "--no-chat"]) == 0
    assert last_json(capsys)["identical"] is True


def test_train_yardstick_bench_export(workplace, capsys, monkeypatch):
    monkeypatch.chdir(workplace)
    assert main(["train", str(workplace / "train.yaml")]) == 0
    final = workplace / "run" / "final"
    assert json.loads((final / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [0, 3, 4]
    (workplace / "prompts.jsonl").write_text('{"prompt": "hello there"}\n{"prompt": "abc abc"}\n')
    assert main(["bench", "--target", str(workplace / "target"), "--draft", str(final), "--speculate", "always",
                 "--dataset-file", str(workplace / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "12",
                 "--concurrency", "1,2", "--output", str(workplace / "bench")]) == 0
    results = json.loads((workplace / "bench" / "results.json").read_text())
    assert all(c["mismatches"] == 0 for c in results["overall"]["by_concurrency"].values())
    assert main(["yardstick", "--draft", str(final), "--target", str(workplace / "target"), "--data",
                 str(workplace / "data"), "--prompts", str(workplace / "yard-prompts.jsonl"), "--table",
                 str(workplace / "yard.md"), "--per-benchmark", "1", "--max-new-tokens", "8"]) == 0
    for form in ("dflash2", "dflash-v1"):       # gguf takes its tokenizer from a target GGUF, which this one lacks
        extra = ["--measure-prompts", "1", "--measure-tokens", "8"] if form == "dflash-v1" else []
        assert main(["export", str(final), "--to", form, "--out", str(workplace / f"export-{form}"),
                     "--target", str(workplace / "target"), *extra]) == 0


def test_published_qwen35_draft_shape_loads_and_decodes(workplace):
    """The published Qwen3.5 drafts: block 16, five taps spread over the target, the mask token at the
    end of the vocabulary, the target's head_dim and rope theta."""
    target = tiny_target("qwen3_5", num_layers=8)
    text = target.config
    published = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "is_causal": False,
                 "hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size, "num_hidden_layers": 5,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": text.head_dim,
                 "vocab_size": text.vocab_size, "rms_norm_eps": 1e-6, "rope_theta": 1e7,
                 "max_position_embeddings": 512, "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048,
                 "num_target_layers": text.num_hidden_layers, "tie_word_embeddings": False,
                 "dflash_config": {"block_size": 16, "target_layer_ids": [1, 2, 4, 5, 6],
                                   "mask_token_id": text.vocab_size - 1, "conv_kernel_size": 2, "conv_group_size": 16,
                                   "selector_rank": 256, "selector_top_k": 16}}
    config = DFlash2Config.from_dict(published)
    torch.manual_seed(0)
    draft = DFlash2DraftModel(config).eval()
    assert (config.block_size, config.target_layer_ids, config.mask_token_id) == (16, [1, 2, 4, 5, 6], 127)
    prompt = [5, 9, 11, 40]
    ids = torch.tensor([prompt])
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20,
                               do_sample=False, eos_token_id=None, pad_token_id=0)[0, 4:].tolist()
    decoder = SpeculativeDecoder(TargetAdapter(target, config.target_layer_ids), draft, speculate="always")
    assert decoder.generate([prompt], GenerationConfig(max_new_tokens=20))[0].tokens == expected
