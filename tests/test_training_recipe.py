"""The recipe options of the training issue: distillation to the target's own distribution, a
frequency-ranked draft vocabulary, a CPU-time budget and the held-out split."""
from __future__ import annotations

import torch

from dflash2.data.holdout import HOLDOUT_MODULUS, is_held_out
from dflash2.data.vocab import coverage, frequency_vocabulary
from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.model.draft import DFlash2DraftModel
from dflash2.targets.tiny import tiny_target
from dflash2.training.trainer import Trainer
from training_util import small_config, synthetic_sequences


def test_frequency_vocabulary_keeps_the_frequent_and_required_tokens():
    seqs = [(torch.tensor([9, 5, 5, 5, 7, 7, 3]), torch.tensor([False, True, True, True, True, True, True]))]
    ids = frequency_vocabulary(seqs, 3, vocab_size=12, always=[11])
    assert ids.tolist() == [5, 7, 11]                      # 5 (x3), 7 (x2), the stop token; 9 is unsupervised
    assert abs(coverage(seqs, ids, 12) - 5 / 6) < 1e-9


def test_holdout_is_a_stable_small_share():
    ids = [f"sharegpt:{i}" for i in range(6400)]
    held = [i for i in ids if is_held_out(i)]
    assert 0.5 / HOLDOUT_MODULUS < len(held) / len(ids) < 2.0 / HOLDOUT_MODULUS
    assert held == [i for i in ids if is_held_out(i)]      # a pure function of the id


def test_reduced_vocabulary_and_distillation_train_and_decode_losslessly(tmp_path):
    target = tiny_target("llama")
    seqs = synthetic_sequences(16)
    cfg = small_config(tmp_path / "run", draft={"draft_vocab_size": 40}, loss={"distill_weight": 0.5, "distill_top_k": 4},
                       train={"steps": 3, "save_dtype": "fp32"})
    trainer = Trainer(cfg, target_model=target, train_sequences=seqs)
    summary = trainer.train()
    assert summary["steps"] == 3 and 0.9 < summary["build"]["draft_vocab_coverage"] <= 1.0
    assert all(torch.isfinite(torch.tensor(float(summary["last"]["loss"]))) for _ in [0])
    final = DFlash2DraftModel.from_pretrained(tmp_path / "run" / "final")
    assert final.config.draft_vocab_size == 40 and int(final.t2d.sum()) == 40
    assert torch.equal(final.draft_token_ids(), trainer.draft.draft_token_ids().cpu())
    prompts = [seqs[0][0][:6].tolist(), seqs[1][0][:9].tolist()]
    config = GenerationConfig(max_new_tokens=12)
    spec = SpeculativeDecoder(TargetAdapter(target, final.config.target_layer_ids), final, "always").generate(prompts, config)
    plain = SpeculativeDecoder(TargetAdapter(target)).generate(prompts, config)
    assert [r.tokens for r in spec] == [r.tokens for r in plain]
    trainer.close()


def test_cpu_budget_stops_training_and_exports(tmp_path):
    cfg = small_config(tmp_path / "run", train={"steps": 500, "max_cpu_seconds": 0.5})
    trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(16))
    summary = trainer.train()
    assert 1 <= summary["steps"] < 500 and summary["cpu_seconds"] >= 0.5
    assert (tmp_path / "run" / "final" / "config.json").is_file()
    trainer.close()


def test_init_from_a_full_vocabulary_draft_into_a_reduced_one(tmp_path):
    """Continuing a trained full-vocabulary draft with a draft vocabulary: every weight carries
    over, the vocabulary is ranked from the data, and the logits are the full ones restricted to it."""
    target = tiny_target("llama")
    seqs = synthetic_sequences(16)
    first = small_config(tmp_path / "a", train={"steps": 2, "save_dtype": "fp32"})
    Trainer(first, target_model=target, train_sequences=seqs).train()
    cfg = small_config(tmp_path / "b", draft={"init_from": str(tmp_path / "a" / "final"), "draft_vocab_size": 50},
                       train={"steps": 1})
    trainer = Trainer(cfg, target_model=target, train_sequences=seqs)
    full = DFlash2DraftModel.from_pretrained(tmp_path / "a" / "final")
    for name, tensor in full.state_dict().items():
        assert torch.equal(trainer.draft.state_dict()[name].cpu(), tensor), name
    full.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    hidden = torch.randn(3, full.config.hidden_size)
    reduced = trainer.draft.logits(hidden)
    assert reduced.shape == (3, 50)
    assert torch.allclose(reduced, full.logits(hidden)[:, trainer.draft.draft_token_ids()], atol=1e-5)
    trainer.close()


def test_features_only_fills_the_cache(tmp_path, monkeypatch):
    from dflash2.training import trainer as trainer_module

    seqs = synthetic_sequences(5)
    monkeypatch.setattr(trainer_module, "load_sequences", lambda *a, **k: (seqs, {"records": len(seqs)}))
    monkeypatch.setattr(trainer_module, "check_inputs", lambda cfg: [])  # data.train is no shard directory here
    target = tiny_target("llama")
    monkeypatch.setattr("dflash2.targets.builtin.load_target", lambda *a, **k: (target, None))
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{train: [{tmp_path}], feature_cache_dir: {tmp_path / 'cache'}, max_seq_len: 64}}\n"
                      "draft: {num_layers: 1, selector_rank: 8, selector_top_k: 8}\nloss: {distill_top_k: 3}\n"
                      "train: {progress: false, batch_size: 4, steps: 3}\n")
    assert trainer_module.main([str(config), "--features-only"]) == 0
    assert len(list((tmp_path / "cache").rglob("*.safetensors"))) == 5
