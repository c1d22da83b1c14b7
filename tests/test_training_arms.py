"""Equal-budget arms differ only in their switched part: DFlash v1, +selector, +convs and DFlash2
built with one seed share every common initial weight, and a selector (trained on detached inputs,
clipped on its own) leaves the backbone's training trajectory bit-identical to v1's."""
from __future__ import annotations

import torch

from dflash2.targets.tiny import tiny_target
from dflash2.training.trainer import Trainer
from training_util import small_config, synthetic_sequences


def _backbone_after_steps(tmp_path, use_selector: bool, use_conv: bool, separate: bool, steps: int = 3):
    """Non-selector parameters of a tiny draft before / after `steps` optimiser steps (clipping active;
    64 candidates of 128 tokens, so the label is often among them and the selector loss is not 0)."""
    cfg = small_config(tmp_path / f"{use_selector}-{use_conv}-{separate}",
                       draft={"use_selector": use_selector, "use_conv": use_conv, "selector_top_k": 64},
                       optim={"grad_clip": 0.05, "clip_selector_separately": separate, "warmup_fraction": 0.0})
    trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(8))
    initial = {n: p.detach().clone() for n, p in trainer.draft.named_parameters() if "candidate_selector" not in n}
    norms = [trainer.train_step()[1] for _ in range(steps)]
    trainer.close()
    final = {n: p.detach().clone() for n, p in trainer.draft.named_parameters() if "candidate_selector" not in n}
    return initial, final, norms


def test_arms_share_their_common_initial_weights(tmp_path):
    v1, _, _ = _backbone_after_steps(tmp_path, False, False, True, steps=0)
    for use_selector, use_conv in ((True, False), (False, True), (True, True)):
        arm, _, _ = _backbone_after_steps(tmp_path, use_selector, use_conv, True, steps=0)
        for name, tensor in v1.items():
            assert torch.equal(arm[name], tensor), (use_selector, use_conv, name)


def test_selector_does_not_change_how_the_backbone_trains(tmp_path):
    # The selector learns from detached inputs; clipped on its own it leaves the backbone's
    # trajectory bit-identical to DFlash v1's. One shared clip norm couples them (the defect this
    # guards against), which the second half shows.
    _, v1, _ = _backbone_after_steps(tmp_path, False, False, True)
    _, with_selector, norms = _backbone_after_steps(tmp_path, True, False, True)
    assert all(set(n) == {"grad_norm", "grad_norm_selector"} for n in norms)
    for name, tensor in v1.items():
        assert torch.equal(with_selector[name], tensor), name
    _, shared_clip, norms = _backbone_after_steps(tmp_path, True, False, False)
    assert all(set(n) == {"grad_norm"} for n in norms)
    assert any(not torch.equal(shared_clip[name], tensor) for name, tensor in v1.items())
