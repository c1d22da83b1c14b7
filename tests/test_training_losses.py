"""Training losses: decayed CE reduces to plain mean CE, chunking is exact, selector gradients go
where documented, teacher-forced tau matches a direct count, and one step lowers the loss."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dflash2.targets.tiny import tiny_draft, tiny_target
from dflash2.training.batches import Example, build_batch
from dflash2.training.losses import block_losses
from dflash2.training.weighting import position_weights
from dflash2.training.trainer import Trainer
from training_util import small_config, synthetic_sequences


def _setup(use_selector=True, seed=0):
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=4, use_selector=use_selector, use_conv=True, seed=seed,
                       top_k=64).train()
    draft.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    examples = [Example(ids.long(), mask, key=(0, i), index=i)
                for i, (ids, mask) in enumerate(synthetic_sequences(3, seed=seed))]
    batch = build_batch(examples, block_size=4, num_anchors=5, mask_token_id=127, window=None, seed=0)
    features = torch.randn(3, batch.input_ids.shape[1], draft.fc.in_features, generator=torch.Generator().manual_seed(2))
    return draft, batch, features


def _hidden(draft, batch, features):
    context = draft.context_kv(features, batch.positions)
    return draft.forward_blocks(batch.block_ids, batch.block_positions, context, batch.attn_mask)


def test_infinite_gamma_without_selector_is_plain_mean_ce():
    draft, batch, features = _setup(use_selector=False)
    hidden = _hidden(draft, batch, features)
    weights = position_weights(4, math.inf)
    loss, stats = block_losses(draft, hidden, batch, weights, float(batch.label_mask.sum()), chunk=7)
    logits = draft.logits(hidden[:, :, 1:])[batch.label_mask]
    reference = F.cross_entropy(logits, batch.labels[batch.label_mask])
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    assert position_weights(8, 4.0)[0] == 1 and torch.isclose(position_weights(8, 4.0)[4], torch.tensor(math.exp(-1.0)))


def test_chunking_changes_nothing():
    draft, batch, features = _setup()
    weights = position_weights(4, 4.0)
    results = []
    for chunk in (5, 1000):
        draft.zero_grad()
        loss, _ = block_losses(draft, _hidden(draft, batch, features), batch, weights, 10.0, chunk=chunk)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in draft.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("to_backbone", [False, True])
def test_selector_gradient_reaches_backbone_only_when_asked(to_backbone):
    draft, batch, features = _setup()
    weights = position_weights(4, 4.0)
    grads = []
    for selector_weight in (0.0, 1.0):
        draft.zero_grad()
        loss, stats = block_losses(draft, _hidden(draft, batch, features), batch, weights, 10.0,
                                   selector_weight=selector_weight, selector_grad_to_backbone=to_backbone)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None})
    assert float(stats.selector) > 0
    backbone = "layers.0.mlp.up_proj.weight"
    moved = not torch.allclose(grads[0][backbone], grads[1][backbone], atol=0, rtol=0)
    assert moved == to_backbone
    assert not torch.equal(grads[1]["candidate_selector.successor_codebook"],
                           torch.zeros_like(grads[1]["candidate_selector.successor_codebook"]))


def test_teacher_forced_tau_counts_leading_correct_positions():
    draft, batch, features = _setup()
    with torch.no_grad():
        hidden = _hidden(draft, batch, features)
        _, stats = block_losses(draft, hidden, batch, position_weights(4, 4.0), 1.0)
        correct = (draft.logits(hidden[:, :, 1:]).argmax(-1) == batch.labels) & batch.label_mask
        # force some correct predictions: relabel with the argmax in a few blocks
        batch.labels[0, :2] = draft.logits(hidden[0, :2, 1:]).argmax(-1)
        _, forced = block_losses(draft, hidden, batch, position_weights(4, 4.0), 1.0)
        correct = (draft.logits(hidden[:, :, 1:]).argmax(-1) == batch.labels) & batch.label_mask
    leading = correct.float().cumprod(-1).sum(-1)
    expected = ((1 + leading) * batch.block_valid).sum()
    torch.testing.assert_close(forced.tau_base, expected)
    assert float(forced.tau_base) > float(stats.tau_base)
    assert torch.equal(forced.top1, correct.float().sum(dim=(0, 1)))


def test_one_step_lowers_the_loss(tmp_path):
    # A unit final norm gives large initial logits and a gradient that one Adam step clearly follows.
    cfg = small_config(tmp_path, optim={"lr": 3e-3, "warmup_fraction": 0.0}, draft={"final_norm_init": 1.0})
    trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(8))
    examples = trainer.order.shard(0, 0, 1, 1)[0]
    batch = trainer._batch(examples).to(trainer.dist.device)
    features = trainer.features(batch).features

    def loss_now():
        with torch.no_grad():
            return float(trainer.module(features, batch, 1.0)[0])

    before = loss_now()
    trainer.train_step()
    after = loss_now()
    trainer.close()
    assert after < before, (before, after)


def test_loss_stats_add_reduce_and_summarise():
    from dataclasses import fields

    from dflash2.training.distributed import Dist
    from dflash2.training.losses import LossStats

    draft, batch, features = _setup()
    with torch.no_grad():
        _, a = block_losses(draft, _hidden(draft, batch, features), batch, position_weights(4, 4.0), 1.0)
    b = LossStats(*(t * 2 + 1 for t in (getattr(a, f.name) for f in fields(a))))
    total = LossStats.zeros(3) + a + b
    for f in fields(total):
        got = getattr(total, f.name)
        assert got.dtype == torch.float64 and torch.equal(got, getattr(a, f.name).double() + getattr(b, f.name).double())
    reduced = total.reduced(Dist())                                      # one process: the same sums
    assert all(torch.equal(getattr(reduced, f.name), getattr(total, f.name)) for f in fields(total))
    summary = total.summary(selector_weight=1.0, has_selector=True)
    assert list(summary) == ["loss", "loss_ce", "tau_base", "top1", "topk", "blocks", "acceptance_alpha",
                             "loss_selector", "loss_selector_in_topk", "tau", "selector_acc"]
    assert summary["acceptance_alpha"] == float(total.alpha) / float(total.weight_alpha)   # b's made-up teacher
    assert "acceptance_alpha" not in a.summary(selector_weight=1.0, has_selector=True)     # no teacher, no alpha
    assert summary["loss"] == summary["loss_ce"] + summary["loss_selector"] and len(summary["top1"]) == 3
    assert summary["tau"] == float(total.tau) / float(total.blocks)
    without = total.summary(selector_weight=1.0, has_selector=False)
    assert set(without) == {"loss", "loss_ce", "tau_base", "top1", "topk", "blocks", "acceptance_alpha", "tau"}
    assert without["tau"] == without["tau_base"] and without["loss"] == without["loss_ce"]
