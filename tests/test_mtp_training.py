"""Training MTP heads with the draft trainer (`draft.family: mtp`, `training.mtp_step`).

The training recursion is the inference recursion: every block position's output equals the head
run from scratch on the sequence up to the anchor with the true tokens fed (so what is trained is
what the proposer runs). A short run on repeating sequences raises the teacher-forced acceptance,
exports a head that loads and decodes losslessly, and resumes on the uninterrupted trajectory.
Warm starts: from the target's last layer (a target without a head) and from the target's own
`mtp.*` head (fine-tuning it). Bad configs are refused naming the key.
"""
from __future__ import annotations

import json

import pytest
import torch

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error
from dflash2.model.mtp import create_mtp_head, target_final_norm
from dflash2.model.mtp_checkpoint import load_mtp_head
from dflash2.targets.tiny import save_with_mtp, tiny_target
from dflash2.training.batches import Example, build_batch
from dflash2.training.config import TrainConfig
from dflash2.training.mtp_step import build_mtp_head, mtp_block_hidden
from dflash2.training.trainer import Trainer
from test_lossless_hybrid import hf_greedy
from test_mtp_lossless import fresh_recursion
from training_util import small_config, synthetic_sequences

MTP = {"family": "mtp", "block_size": 5}


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_the_training_recursion_is_the_inference_recursion(family):
    target = tiny_target(family)
    head = create_mtp_head(target.config, block_size=5, seed=2).eval()
    head.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    sequences = synthetic_sequences(3, seed=4)
    batch = build_batch([Example(ids, mask, key=(0, i)) for i, (ids, mask) in enumerate(sequences)], block_size=5,
                        num_anchors=6, mask_token_id=127, window=None, seed=0)
    adapter, norm = TargetAdapter(target, head.config.target_layer_ids), target_final_norm(target)
    try:
        with torch.no_grad():
            _, features = adapter.features(batch.input_ids, batch.attention_mask)
            hidden = mtp_block_hidden(head, norm(features), batch)                      # [b, N, B, H]
        for row, (ids, _) in enumerate(sequences):
            for n, anchor in enumerate(batch.anchors[row].tolist()):
                if not batch.block_valid[row, n]:
                    continue
                prefix, truth = ids[:anchor + 1].tolist(), ids[anchor + 1:anchor + 5].tolist()
                _, outputs = fresh_recursion(head, target, norm, adapter, prefix, 4, forced=truth)
                torch.testing.assert_close(hidden[row, n, 1:], outputs, atol=2e-5, rtol=2e-5)
    finally:
        adapter.close()


def test_a_short_run_learns_exports_and_decodes_losslessly(tmp_path):
    target = tiny_target("llama")
    cfg = small_config(tmp_path / "run", draft={**MTP, "warm_start_from_target": True},
                       train={"steps": 40, "batch_size": 4}, optim={"lr": 3e-3})
    sequences = synthetic_sequences(16)     # each has a motif of its own: measured on them, not on others
    trainer = Trainer(cfg, target_model=target, train_sequences=sequences, eval_sequences=sequences[:8])
    before = trainer.evaluate()
    summary = trainer.train()
    after = trainer.evaluate()
    trainer.close()
    assert "layers.0.self_attn.q_proj.weight" in trainer.build_report["warm_started"]
    assert after["tau"] > before["tau"] + 1.0 and after["loss_ce"] < before["loss_ce"] - 2.0
    assert "loss_selector" not in after and len(after["top1"]) == 4
    head = load_mtp_head(summary["final_dir"])
    assert head.config.origin == "trained" and head.config.block_size == 5
    prompts = [ids[:12].tolist() for ids, _ in sequences[:4]]
    decoder = SpeculativeDecoder(TargetAdapter(target, head.config.target_layer_ids), head, speculate="always")
    results = decoder.generate(prompts, GenerationConfig(max_new_tokens=12))
    assert [r.tokens for r in results] == [hf_greedy(target, p, 12) for p in prompts]


def _run(out_dir, resume=False, stop_at=None):
    cfg = small_config(out_dir, draft=MTP, train={"steps": 4, "batch_size": 4, "grad_accum": 2})
    trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(12))
    summary = trainer.train(resume=resume, stop_at=stop_at)
    state = {k: v.clone() for k, v in trainer.draft.state_dict().items()}
    trainer.close()
    return summary, state


def test_resume_follows_the_uninterrupted_trajectory(tmp_path):
    _, reference = _run(tmp_path / "straight")
    _run(tmp_path / "interrupted", stop_at=2)
    summary, resumed = _run(tmp_path / "interrupted", resume=True)
    assert summary["steps"] == 4
    for name in reference:
        assert torch.equal(reference[name], resumed[name]), name


def test_fine_tuning_starts_from_the_targets_own_head(tmp_path):
    target = tiny_target("qwen3_5", seed=2)
    written = save_with_mtp(target, tmp_path / "target", seed=4)
    cfg = small_config(tmp_path / "run", target={"name": str(tmp_path / "target")},
                       draft={**MTP, "warm_start_from_target": True})
    head, report = build_mtp_head(cfg, target, None, str(tmp_path / "target"))
    assert report["warm_started"] == "target's MTP head"
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, written["mtp." + name]), name


def test_mtp_config_keys():
    with pytest.raises(DFlash2Error, match="draft.family"):
        TrainConfig.from_dict({"draft": {"family": "eagle"}})
    with pytest.raises(DFlash2Error, match="draft.draft_vocab_size"):
        TrainConfig.from_dict({"draft": {"family": "mtp", "draft_vocab_size": 1000}})
    config = TrainConfig.from_dict({"draft": {"family": "mtp"}})
    assert json.loads(json.dumps(config.to_dict()))["draft"]["family"] == "mtp"
