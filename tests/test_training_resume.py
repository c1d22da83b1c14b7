"""Resume: K steps straight equal K/2 steps, an interruption (checkpoint) and K/2 resumed steps, with
and without the replay buffer (`loss.replay_*`), which the checkpoint carries."""
from __future__ import annotations

import json

import pytest
import torch

from dflash2.model.draft import DFlash2DraftModel
from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import tiny_target
from dflash2.training.trainer import Trainer, _check_same_config
from training_util import small_config, synthetic_sequences

TIMING = ("tokens_per_s",)
# Replay on, with a top-64 candidate list over the tiny target's 128 tokens (near misses from the start).
REPLAY = {"draft": {"num_layers": 2, "selector_rank": 8, "selector_top_k": 64, "conv_group_size": 16},
          "loss": {"num_anchors": 4, "logits_chunk": 16, "replay_fraction": 0.5, "replay_max_times": 2}}


def _run(out_dir, resume=False, stop_at=None, sections=None):
    cfg = small_config(out_dir, train={"steps": 4, "batch_size": 4, "grad_accum": 2, "log_every": 1,
                                       "checkpoint_every": None}, **(sections or {}))
    trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(12),
                      eval_sequences=synthetic_sequences(4, seed=9))
    summary = trainer.train(resume=resume, stop_at=stop_at)
    state = {k: v.clone() for k, v in trainer.draft.state_dict().items()}
    if trainer.replay is not None:
        state["replay"] = trainer.replay.state_dict()
    trainer.close()
    return summary, state


def _log(out_dir):
    lines = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in lines]


@pytest.mark.parametrize("sections", [None, REPLAY], ids=["uniform", "replay"])
def test_resume_follows_the_uninterrupted_trajectory(tmp_path, sections):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    _, reference = _run(straight, sections=sections)
    partial, _ = _run(interrupted, stop_at=2, sections=sections)
    assert partial["steps"] == 2 and not (interrupted / "final").exists()
    summary, resumed = _run(interrupted, resume=True, sections=sections)
    assert summary["steps"] == 4
    assert reference.keys() == resumed.keys()
    for name in reference:
        same = reference[name] == resumed[name] if name == "replay" else torch.equal(reference[name], resumed[name])
        assert same, name
    assert _log(straight) == _log(interrupted)
    if sections is REPLAY:   # the buffer did work on both sides of the interruption
        replayed = [r["replay_blocks"] for r in _log(straight) if r["split"] == "train"]
        assert replayed[0] == 0 and all(n > 0 for n in replayed[1:]), replayed
        assert reference["replay"]["keys"]
    final = DFlash2DraftModel.from_pretrained(interrupted / "final")      # exported in bf16
    assert final.fc.weight.dtype == torch.float32  # from_pretrained casts to its dtype argument
    assert (interrupted / "curves.png").stat().st_size > 0


def test_resume_of_a_checkpoint_older_than_a_config_key(tmp_path):
    # Checkpoints written before `optim.clip_selector_separately` existed were trained with one
    # shared clip norm: resuming them needs the key set to false, and says so.
    current = small_config(tmp_path).to_dict()
    saved = {section: dict(keys) for section, keys in current.items()}
    del saved["optim"]["clip_selector_separately"]
    with pytest.raises(DFlash2Error, match="'optim.clip_selector_separately' is True .* trained with False"):
        _check_same_config(saved, current)
    legacy = small_config(tmp_path, optim={"clip_selector_separately": False}).to_dict()
    _check_same_config(saved, legacy)
