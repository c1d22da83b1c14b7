"""The acceptance (LK) loss: alpha = sum min(p, q) by hand, its closed-form gradient against
autograd (softcap, multiplier, chunks, a reduced vocabulary), that a step on it raises alpha, that
weight 0 leaves training bit for bit as it was, the config checks, and the logged metric."""
from __future__ import annotations

import json

import pytest
import torch

from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import tiny_target
from dflash2.training.acceptance import acceptance_logit_grad, acceptance_rate, draft_probs_at
from dflash2.training.config import TrainConfig, load_config
from dflash2.training.head_ce import head_cross_entropy
from dflash2.training.losses import LossOptions, Teacher, block_losses
from dflash2.training.trainer import Trainer
from dflash2.training.weighting import position_weights
from training_util import small_config, synthetic_sequences


def test_acceptance_rate_by_hand():
    q = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.0, 0.9]])
    p = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.4, 0.0]])
    # row 0: min(.5,.2) + min(.3,.5) + min(.2,.3) = .2 + .3 + .2; row 1: .1 + 0 + 0
    torch.testing.assert_close(acceptance_rate(q, p), torch.tensor([0.7, 0.1]))
    # an id the draft cannot propose (-1) reads q = 0
    probs = torch.tensor([[0.25, 0.25, 0.5]])
    assert draft_probs_at(probs, torch.tensor([[2, -1, 0]])).tolist() == [[0.5, 0.0, 0.25]]


def test_alpha_is_one_when_q_equals_p_on_the_support():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 9, generator=gen, dtype=torch.float64), -1)
    torch.testing.assert_close(acceptance_rate(p, p), torch.ones(4, dtype=torch.float64))
    # through the LM-head loss: the target's "top-k" is the whole vocabulary at the draft's own softmax
    hidden = torch.randn(5, 6, dtype=torch.float64, generator=gen)
    weight = torch.randn(9, 6, dtype=torch.float64, generator=gen)
    own = torch.softmax(hidden @ weight.T, -1)
    ids = torch.arange(9).expand(5, -1)
    loss, _, _, _, alpha = head_cross_entropy(hidden, weight, torch.zeros(5, dtype=torch.long), top_k=2, chunk=2,
                                              soft_ids=ids, soft_probs=own, acceptance_weight=1.0)
    torch.testing.assert_close(alpha.double(), torch.ones(5, dtype=torch.float64), atol=1e-6, rtol=0)
    assert float(loss.abs().max()) < 1e-5


def test_at_a_point_mass_target_the_loss_is_the_cross_entropy():
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(7, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(11, 6, dtype=torch.float64, generator=gen)
    labels = torch.randint(0, 11, (7,), generator=gen)
    point = torch.zeros(7, 3, dtype=torch.float64)
    point[:, 0] = 1.0                                                   # p = onehot(label)
    ids = torch.stack([labels, (labels + 1) % 11, (labels + 2) % 11], dim=-1)
    lk, ce, _, _, _ = head_cross_entropy(hidden, weight, labels, top_k=2, chunk=3, soft_ids=ids, soft_probs=point,
                                         acceptance_weight=1.0)
    lk.sum().backward()
    lk_grad, hidden.grad = hidden.grad.clone(), None
    plain, _, _, _, _ = head_cross_entropy(hidden, weight, labels, top_k=2, chunk=3)
    plain.sum().backward()
    torch.testing.assert_close(lk, ce)
    torch.testing.assert_close(lk_grad, hidden.grad)


def test_closed_form_gradient_matches_autograd():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 20, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.stack([torch.randperm(20, generator=gen)[:5] for _ in range(6)])
    ids[::2, 1] = -1                                                    # outside a reduced vocabulary
    p = torch.softmax(torch.randn(6, 5, generator=gen, dtype=torch.float64) * 2, -1)
    probs = torch.softmax(logits, -1)
    alpha, grad = acceptance_logit_grad(probs.detach(), ids, p)
    ref_alpha = acceptance_rate(draft_probs_at(probs, ids), p)
    (-ref_alpha.log()).sum().backward()
    torch.testing.assert_close(alpha, ref_alpha.detach())
    torch.testing.assert_close(grad, logits.grad)


@pytest.mark.parametrize("distill", [0.0, 0.4])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_fused_lm_head_loss_matches_a_dense_reference(distill, chunk):
    """(1 - w) * the CE/KL mix + w * (-log alpha), with multiplier and softcap, chunked: loss, alpha
    and the gradient to the hidden states equal the dense autograd computation."""
    gen = torch.Generator().manual_seed(chunk)
    rows, vocab, k, w, mult, cap = 23, 40, 6, 0.6, 0.7, 3.0
    hidden = torch.randn(rows, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, 12, dtype=torch.float64, generator=gen)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    labels[::5] = -1
    soft_ids = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(rows)])
    soft_ids[::3, 0] = -1
    soft_probs = torch.softmax(torch.randn(rows, k, generator=gen), -1)
    upstream = torch.rand(rows, dtype=torch.float64, generator=gen)
    loss, ce, _, _, alpha = head_cross_entropy(hidden, weight, labels, top_k=4, chunk=chunk, multiplier=mult,
                                               softcap=cap, soft_ids=soft_ids, soft_probs=soft_probs,
                                               hard_weight=1.0 - distill, acceptance_weight=w)
    (loss.double() * upstream).sum().backward()
    fused, hidden.grad = hidden.grad.clone(), None

    log_probs = torch.log_softmax(torch.tanh(mult * (hidden @ weight.T) / cap) * cap, -1)
    valid = labels >= 0
    hard = -log_probs.gather(1, labels.clamp(min=0)[:, None])[:, 0] * valid
    kept = soft_probs.double() * (soft_ids >= 0)
    kept = kept / kept.sum(-1, keepdim=True)
    soft = -(kept * log_probs.gather(1, soft_ids.clamp(min=0))).sum(-1)
    mix = (1 - distill) * hard + distill * soft if distill else hard
    ref_alpha = acceptance_rate(draft_probs_at(log_probs.exp(), soft_ids), soft_probs.double())
    ref = (1 - w) * mix + w * -ref_alpha.log()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(alpha.double(), ref_alpha.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(loss.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ce.double(), hard.detach(), atol=1e-5, rtol=1e-5)   # `ce` stays the hard CE
    torch.testing.assert_close(fused, hidden.grad, atol=1e-5, rtol=1e-4)


def test_a_step_on_the_loss_moves_q_toward_p():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 30, generator=gen, requires_grad=True)
    ids = torch.stack([torch.randperm(30, generator=gen)[:5] for _ in range(4)])
    p = torch.softmax(torch.randn(4, 5, generator=gen) * 3, -1)
    before = acceptance_rate(draft_probs_at(torch.softmax(logits, -1), ids), p)
    (-before.log()).sum().backward()
    with torch.no_grad():
        after = acceptance_rate(draft_probs_at(torch.softmax(logits - 0.5 * logits.grad, -1), ids), p)
    assert (after > before).all()
    # the same through the fused LM-head loss: one SGD step on the hidden states
    hidden = torch.randn(8, 6, generator=gen, requires_grad=True)
    weight = torch.randn(30, 6, generator=gen)
    ids = torch.stack([torch.randperm(30, generator=gen)[:5] for _ in range(8)])
    p = torch.softmax(torch.randn(8, 5, generator=gen) * 3, -1)
    kwargs = dict(top_k=2, chunk=3, soft_ids=ids, soft_probs=p, acceptance_weight=1.0)
    loss, _, _, _, alpha0 = head_cross_entropy(hidden, weight, torch.zeros(8, dtype=torch.long), **kwargs)
    loss.sum().backward()
    _, _, _, _, alpha1 = head_cross_entropy((hidden - 0.3 * hidden.grad).detach(), weight,
                                            torch.zeros(8, dtype=torch.long), **kwargs)
    assert (alpha1 > alpha0).all()


def _losses_setup():
    from test_training_losses import _hidden, _setup

    draft, batch, features = _setup()
    b, n, block = batch.block_positions.shape
    gen = torch.Generator().manual_seed(5)
    ids = torch.stack([torch.randperm(128, generator=gen)[:4] for _ in range(b * n * (block - 1))])
    teacher = Teacher(ids.view(b, n, block - 1, 4), torch.randn(b, n, block - 1, 4, generator=gen))
    return draft, batch, features, teacher, _hidden


def _step(draft, batch, features, hidden_fn, **kwargs):
    draft.zero_grad()
    loss, stats = block_losses(draft, hidden_fn(draft, batch, features), batch, position_weights(4, 4.0), 9.0,
                               chunk=5, **kwargs)
    loss.backward()
    return loss.detach(), stats, [p.grad.clone() for p in draft.parameters() if p.grad is not None]


def test_weight_zero_is_bit_identical_and_still_logs_alpha():
    """With acceptance_weight 0 the loss and every gradient are those of the recipe without the option,
    bit for bit, whether or not the batch carries a teacher (the teacher then only feeds the metric)."""
    draft, batch, features, teacher, hidden_fn = _losses_setup()
    plain, plain_stats, plain_grads = _step(draft, batch, features, hidden_fn)
    same, same_stats, same_grads = _step(draft, batch, features, hidden_fn, teacher=teacher,
                                         options=LossOptions(acceptance_weight=0.0))
    assert torch.equal(plain, same) and len(plain_grads) == len(same_grads)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, same_grads))
    assert torch.equal(plain_stats.ce, same_stats.ce)
    assert "acceptance_alpha" not in plain_stats.summary(1.0, True)
    assert 0 < same_stats.summary(1.0, True)["acceptance_alpha"] < 1
    for distill in (0.5,):   # distillation: the option at 0 changes nothing either
        a = _step(draft, batch, features, hidden_fn, teacher=teacher, distill_weight=distill)
        b = _step(draft, batch, features, hidden_fn, teacher=teacher, distill_weight=distill,
                  options=LossOptions(acceptance_weight=0.0))
        assert torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[2], b[2]))
    lk = _step(draft, batch, features, hidden_fn, teacher=teacher, options=LossOptions(acceptance_weight=0.5))
    assert not torch.equal(plain, lk[0])                                  # and a weight > 0 does change it
    with pytest.raises(DFlash2Error, match="acceptance_weight"):
        _step(draft, batch, features, hidden_fn, options=LossOptions(acceptance_weight=0.5))


def test_weight_zero_trainer_step_matches_the_recipe_without_the_key(tmp_path):
    seqs = synthetic_sequences(8)
    results = []
    for extra in ({}, {"acceptance_weight": 0.0}):
        cfg = small_config(tmp_path / f"run{len(results)}", loss={"distill_weight": 0.5, "distill_top_k": 4, **extra},
                           train={"steps": 1})
        trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=seqs)
        stats, _ = trainer.train_step()
        results.append((stats, {k: v.clone() for k, v in trainer.draft.state_dict().items()}))
        trainer.close()
    (a, wa), (b, wb) = results
    assert torch.equal(a.ce, b.ce) and torch.equal(a.alpha, b.alpha) and float(a.weight_alpha) > 0
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("raw, keys", [
    ({"loss": {"acceptance_weight": 0.5, "distill_top_k": 0}}, ("loss.acceptance_weight", "loss.distill_top_k")),
    ({"loss": {"distill_weight": 0.5, "distill_top_k": 0}}, ("loss.distill_weight", "loss.distill_top_k")),
    ({"loss": {"acceptance_weight": 1.5}}, ("loss.acceptance_weight",)),
    ({"loss": {"acceptance_weight": -0.1}}, ("loss.acceptance_weight",)),
    ({"loss": {"acceptance_weight": "half"}}, ("loss.acceptance_weight",)),
    ({"loss": {"distill_top_k": -1}}, ("loss.distill_top_k",)),
])
def test_bad_acceptance_configs_are_refused_in_one_line(raw, keys):
    with pytest.raises(DFlash2Error) as err:
        TrainConfig.from_dict(raw)
    message = str(err.value)
    assert all(key in message for key in keys) and "\n" not in message


def test_override_and_defaults():
    assert TrainConfig.from_dict({}).loss.acceptance_weight == 0.0
    cfg = load_config(None, ["loss.acceptance_weight=0.5"])
    assert cfg.loss.acceptance_weight == 0.5 and LossOptions.from_section(cfg.loss).acceptance_weight == 0.5
    assert load_config(None, ["loss.distill_top_k=0"]).loss.distill_top_k == 0   # no teacher: fine on its own


@pytest.mark.parametrize("draft", [{"draft_vocab_size": 40}, {"family": "mtp", "block_size": 5}])
def test_two_step_run_with_the_lk_loss_logs_alpha(tmp_path, draft):
    cfg = small_config(tmp_path / "run", draft=draft,
                       loss={"acceptance_weight": 0.5, "distill_top_k": 4}, train={"steps": 2})
    trainer = Trainer(cfg, target_model=tiny_target("llama"), train_sequences=synthetic_sequences(8))
    assert trainer.features.top_k == 4                                   # the teacher is computed for it
    summary = trainer.train()
    trainer.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "acceptance_alpha" in r]
    assert summary["steps"] == 2 and len(train) == 2
    assert all(0 < r["acceptance_alpha"] <= 1 and r["loss"] == r["loss"] for r in train)
