"""MTP heads on disk: the target's own (`mtp.*` tensors of Qwen3.5 / Qwen3-Next checkpoints) and the
head's own checkpoints.

A tiny random Qwen3.5 (dense MTP layer) and Qwen3-Next (MoE MTP layer, experts stored one tensor
each, as Qwen3-Next ships them) are saved with a random MTP head added as `mtp.*`; transformers
drops those tensors on load, dflash2 reads them back exactly (experts fused in the order gate, up),
an MoE expert computes what the per-expert tensors say, `generate --proposer mtp` decodes with the
target's own head and equals plain decoding, and a target without a head is refused in one line.
The head's own checkpoints round-trip and refuse bad tensors.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3_5Config, Qwen3_5ForConditionalGeneration

from dflash2.cli import main
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.model.mtp import create_mtp_head
from dflash2.model.mtp_checkpoint import head_from_target, load_mtp_head, save_mtp_head, target_mtp_state
from dflash2.targets.tiny import save_with_mtp, tiny_config, tiny_target
from matrix_util import tiny_tokenizer
from test_lossless_hybrid import hf_greedy


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """family -> (directory, the mtp.* tensors written)."""
    root = tmp_path_factory.mktemp("mtp-targets")
    out = {}
    for family, per_expert in (("qwen3_5", False), ("qwen3_next", True)):
        directory = root / family
        written = save_with_mtp(tiny_target(family, seed=2), directory, seed=4, per_expert=per_expert)
        tiny_tokenizer().save_pretrained(directory)
        out[family] = (directory, written)
    plain = root / "llama"
    tiny_target("llama").save_pretrained(plain)
    tiny_tokenizer().save_pretrained(plain)
    out["llama"] = (plain, {})
    return out


def test_transformers_drops_the_mtp_tensors_and_dflash2_reads_them(targets):
    directory, written = targets["qwen3_5"]
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert not any(name.startswith("mtp") for name in model.state_dict())
    head = head_from_target(directory, model.config)
    assert head.config.origin == "target"
    state = head.state_dict()
    assert {"mtp." + n for n in state} == set(written)
    for name, tensor in state.items():
        assert torch.equal(tensor, written["mtp." + name])


def test_experts_stored_one_tensor_each_are_fused_gate_then_up(targets):
    directory, written = targets["qwen3_next"]
    state = target_mtp_state(directory)
    fused, down = state["layers.0.mlp.experts.gate_up_proj"], state["layers.0.mlp.experts.down_proj"]
    experts = fused.shape[0]
    assert experts == 4 and not any(".experts.0." in n for n in state)
    for e in range(experts):
        assert torch.equal(fused[e], torch.cat([written[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"],
                                                written[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"]]))
        assert torch.equal(down[e], written[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"])


def test_an_expert_computes_what_its_own_tensors_say(targets):
    """The head's MoE layer, one expert at a time, against a SwiGLU built from the per-expert tensors."""
    directory, written = targets["qwen3_next"]
    head = head_from_target(directory, tiny_config("qwen3_next"))
    experts = head.layers[0].mlp.experts
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    for e in range(4):
        gate, up, down = (written[f"mtp.layers.0.mlp.experts.{e}.{p}_proj.weight"] for p in ("gate", "up", "down"))
        want = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)
        got = experts(x, torch.full((3, 1), e), torch.ones(3, 1))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_generate_with_the_targets_own_head(targets, family, capsys):
    directory, _ = targets[family]
    capsys.readouterr()
    assert main(["generate", "--target", str(directory), "--proposer", "mtp", "--prompt", "hello there",
                 "--max-new-tokens", "12", "--compare", "--speculate", "always", "--json", "--no-chat"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["identical"] is True
    assert "MTP head" in report["draft"] and report["proposer"] == "mtp"


def test_a_target_without_a_head_is_refused_in_one_line(targets, capsys):
    directory, _ = targets["llama"]
    assert main(["generate", "--target", str(directory), "--proposer", "mtp", "--prompt", "hi", "--no-chat"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "ships no MTP head" in err


def test_a_head_of_two_layers_is_refused(targets, tmp_path):
    directory, _ = targets["qwen3_5"]
    copy = tmp_path / "two"
    copy.mkdir()
    for file in directory.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 2
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(DFlash2Error, match="declares 2 MTP layers"):
        target_mtp_state(copy)


def test_the_multimodal_qwen3_5_reads_its_text_config(targets):
    """Qwen3_5ForConditionalGeneration: the head is built from the nested text config and decodes
    the text model losslessly."""
    _, written = targets["qwen3_5"]
    config = Qwen3_5Config(text_config=tiny_config("qwen3_5").to_dict(),
                           vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32,
                                              out_hidden_size=64))
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    head = create_mtp_head(model.config, block_size=4, seed=1).eval()
    assert head.config.family == "qwen3_5_text"
    prompts = [[5, 9, 17, 9, 5], [40, 41]]
    expected = [hf_greedy(model, p, 10) for p in prompts]
    decoder = SpeculativeDecoder(TargetAdapter(model, head.config.target_layer_ids), head, speculate="always")
    assert [r.tokens for r in decoder.generate(prompts, GenerationConfig(max_new_tokens=10))] == expected


def test_head_checkpoint_round_trip_and_bad_tensors(tmp_path):
    head = create_mtp_head(tiny_config("qwen3_next"), block_size=5, seed=3)
    save_mtp_head(head, tmp_path / "head")
    names = set(load_file(str(tmp_path / "head" / "model.safetensors")))
    assert all(n.startswith("mtp.") for n in names) and "mtp.fc.weight" in names
    loaded = load_mtp_head(tmp_path / "head")
    assert loaded.config.block_size == 5 and loaded.config.to_dict() == head.config.to_dict()
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    state = load_file(str(tmp_path / "head" / "model.safetensors"))
    state["mtp.fc.weight"][0, 0] = float("nan")
    save_file(state, str(tmp_path / "head" / "model.safetensors"))
    with pytest.raises(DFlash2Error, match="fc.weight"):
        load_mtp_head(tmp_path / "head")
    del state["mtp.norm.weight"]
    save_file(state, str(tmp_path / "head" / "model.safetensors"))
    with pytest.raises(DFlash2Error, match="missing tensor 'norm.weight'"):
        load_mtp_head(tmp_path / "head")


def test_a_head_and_a_draft_are_not_confused(targets, tmp_path, capsys):
    """`--proposer mtp` needs an MTP head, `--proposer draft` a DFlash draft; each is refused in one line
    before the target loads, and so is `--proposer mtp --no-draft`."""
    directory, _ = targets["qwen3_5"]
    head, draft = tmp_path / "head", tmp_path / "draft"
    assert main(["init-draft", "--target", str(directory), "--family", "mtp", "--out", str(head)]) == 0
    assert "the target's own MTP head" in capsys.readouterr().out
    assert main(["init-draft", "--target", str(directory), "--out", str(draft), "--layers", "1"]) == 0
    capsys.readouterr()
    common = ["generate", "--target", str(directory), "--prompt", "hi", "--no-chat", "--max-new-tokens", "2"]
    for extra, message in ((["--proposer", "mtp", "--draft", str(draft)], "is a DFlash draft: use --proposer draft"),
                           (["--proposer", "draft", "--draft", str(head)], "is an MTP head: use --proposer mtp"),
                           (["--proposer", "mtp", "--no-draft"], "--proposer mtp needs a draft")):
        assert main(common + extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err
    assert main(common + ["--draft", str(head), "--json"]) == 0       # the default proposer (hybrid) takes a head
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["proposer"] == "hybrid"
    assert load_mtp_head(head).config.origin == "target"
