"""Recipe options of the block loss: D-PACE position weights against their closed form and a
hand-built loss, the selector's gold candidate, selector weights that follow the token loss, and
the config keys (checked values, old checkpoints resume with the old recipe)."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from dflash2.errors import DFlash2Error
from dflash2.targets.tiny import tiny_draft, tiny_target
from dflash2.training.batches import Example, build_batch
from dflash2.training.config import TrainConfig
from dflash2.training.losses import LossOptions, block_losses
from dflash2.training.trainer import LEGACY_VALUES, _check_same_config
from dflash2.training.weighting import dpace_weights, position_weights, step_share
from training_util import synthetic_sequences


def _setup(top_k=64, block_size=4):
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=block_size, use_selector=True, use_conv=True, seed=0, top_k=top_k).train()
    draft.bind_target(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    examples = [Example(ids.long(), mask, key=(0, i), index=i) for i, (ids, mask) in enumerate(synthetic_sequences(3))]
    batch = build_batch(examples, block_size=block_size, num_anchors=5, mask_token_id=127, window=None, seed=0)
    features = torch.randn(3, batch.input_ids.shape[1], draft.fc.in_features, generator=torch.Generator().manual_seed(2))
    context = draft.context_kv(features, batch.positions)
    hidden = draft.forward_blocks(batch.block_ids, batch.block_positions, context, batch.attn_mask)
    return draft, batch, hidden


def _brute_dpace(q: list[float], supervised: int, alpha: float) -> list[float]:
    """w_j = sum_{m >= j, m < supervised} prod_{i <= m} ((1 - alpha) q_i + alpha), 0 past `supervised`."""
    s = [(1 - alpha) * x + alpha for x in q]
    out = []
    for j in range(len(q)):
        total = 0.0
        for m in range(j, supervised):
            prod = 1.0
            for i in range(m + 1):
                prod *= s[i]
            total += prod
        out.append(total if j < supervised else 0.0)
    return out


@pytest.mark.parametrize("alpha", [0.3, 0.5, 1.0])
def test_dpace_weights_match_the_closed_form(alpha):
    g = torch.Generator().manual_seed(0)
    q = torch.rand(6, 7, generator=g).requires_grad_(True)
    lengths = [7, 5, 1, 0, 3, 7]                                            # supervised prefix per block
    mask = torch.tensor([[i < n for i in range(7)] for n in lengths])
    w = dpace_weights(q, mask, alpha)
    assert not w.requires_grad                                             # weights shape magnitude only
    expected = torch.tensor([_brute_dpace(row.tolist(), n, alpha) for row, n in zip(q.detach(), lengths)])
    torch.testing.assert_close(w, expected, rtol=1e-5, atol=1e-6)
    if alpha == 1.0:                                                        # no confidence left: positions to go
        assert w[0].tolist() == [7, 6, 5, 4, 3, 2, 1] and w[2].tolist() == [1, 0, 0, 0, 0, 0, 0]
    # a surer second position shifts weight to the ones after it (relative to the first)
    surer = q.detach().clone()
    surer[:, 1] = 0.99
    lifted = dpace_weights(surer, mask, alpha)
    if alpha < 1.0:
        assert float(lifted[0, 3] / lifted[0, 0]) > float(w[0, 3] / w[0, 0])


def test_dpace_block_loss_equals_the_weighted_ce_built_by_hand():
    draft, batch, hidden = _setup()
    blocks = float(batch.block_valid.sum())
    options = LossOptions(position_weighting="dpace", dpace_alpha=0.5)
    loss, stats = block_losses(draft, hidden, batch, position_weights(4, 4.0), blocks, selector_weight=0.0,
                               options=options)
    logits = draft.logits(hidden[:, :, 1:])                                # [b, N, 3, V]
    ce = F.cross_entropy(logits.flatten(0, 2), batch.labels.flatten(), reduction="none").view(batch.labels.shape)
    mask = batch.label_mask
    q = torch.exp(-ce.detach()) * mask
    weights = torch.zeros_like(ce)
    for i, j in itertools.product(range(ce.shape[0]), range(ce.shape[1])):
        weights[i, j] = torch.tensor(_brute_dpace(q[i, j].tolist(), int(mask[i, j].sum()), 0.5))
    reference = (weights * ce * mask).sum() / blocks
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    # the gradient is that of the weighted CE with the weights held fixed
    grad = torch.autograd.grad(loss, hidden, retain_graph=True)[0]
    grad_ref = torch.autograd.grad(reference, hidden)[0]
    torch.testing.assert_close(grad, grad_ref, rtol=1e-4, atol=1e-7)
    # the logged CE is the decay-weighted mean in every recipe (comparable across arms)
    _, decay_stats = block_losses(draft, hidden, batch, position_weights(4, 4.0), 1.0, selector_weight=0.0)
    torch.testing.assert_close(stats.ce, decay_stats.ce)
    assert float(loss.detach()) != pytest.approx(float(decay_stats.ce / decay_stats.weight), rel=1e-3)


def test_step_share_counts_blocks_for_dpace_and_weights_for_decay():
    _, batch, _ = _setup()
    w = position_weights(4, 4.0)
    assert step_share(batch, w, "dpace") == float(batch.block_valid.sum()) > 0
    assert step_share(batch, w, "decay") == pytest.approx(float((batch.label_mask.float() * w).sum()))


def _selector_reference(draft, hidden, batch, gold: bool) -> torch.Tensor:
    """The selector CE summed with decay weights, built from the selector's scores directly."""
    w = position_weights(4, 4.0)
    index = batch.label_mask
    hid = hidden[:, :, 1:][index].detach()
    labels = batch.labels[index]
    preds = torch.cat([batch.block_ids[:, :, :1], batch.labels[:, :, :-1]], dim=-1)[index]
    weights = (batch.label_mask.float() * w)[index]
    logits = draft.logits(hid)
    total = torch.zeros(())
    for p in range(labels.numel()):
        cand = logits[p].topk(draft.selector.top_k).indices
        if not (cand == labels[p]).any():
            if not gold:
                continue
            cand = torch.cat([cand[:-1], labels[p:p + 1]])
        scores = draft.selector.scores_given_predecessors(hid[p], preds[p:p + 1], cand, logits[p][cand].detach())[0]
        target = int((cand == labels[p]).nonzero()[0])
        total = total + weights[p] * F.cross_entropy(scores[None], torch.tensor([target]))
    return total


def test_gold_candidate_replaces_the_weakest_in_the_selector_loss_only():
    draft, batch, hidden = _setup(top_k=4)                                   # most labels miss the top 4
    w = position_weights(4, 4.0)
    token_only, _ = block_losses(draft, hidden, batch, w, 1.0, selector_weight=0.0)
    plain, plain_stats = block_losses(draft, hidden, batch, w, 1.0)
    gold, gold_stats = block_losses(draft, hidden, batch, w, 1.0, options=LossOptions(selector_gold=True))
    assert float(plain_stats.weight_topk) < float(plain_stats.weight)     # some labels are missing
    torch.testing.assert_close(plain - token_only, _selector_reference(draft, hidden, batch, gold=False),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gold - token_only, _selector_reference(draft, hidden, batch, gold=True),
                               rtol=1e-4, atol=1e-5)
    assert gold.item() > plain.item()
    # the metrics keep serving semantics: the real top K
    for name in ("selector", "selector_ok", "tau", "topk", "weight_topk"):
        assert torch.equal(getattr(gold_stats, name), getattr(plain_stats, name)), name
    # the gold term trains the selector, not the backbone (detached inputs, as before)
    grads = {}
    for key, loss in (("plain", plain), ("gold", gold)):
        grads[key] = torch.autograd.grad(loss, [draft.selector.successor_codebook, hidden], retain_graph=True)
    assert not torch.equal(grads["plain"][0], grads["gold"][0])
    torch.testing.assert_close(grads["plain"][1], grads["gold"][1])


def test_gold_changes_nothing_when_every_label_is_a_candidate():
    draft, batch, hidden = _setup(top_k=128)                                 # the whole tiny vocabulary
    w = position_weights(4, 4.0)
    plain, _ = block_losses(draft, hidden, batch, w, 1.0)
    gold, _ = block_losses(draft, hidden, batch, w, 1.0, options=LossOptions(selector_gold=True))
    torch.testing.assert_close(gold, plain, rtol=0, atol=0)


def test_selector_weights_follow_the_token_loss_only_when_asked():
    draft, batch, hidden = _setup()
    w = position_weights(4, 4.0)

    def selector_part(**options):
        token, _ = block_losses(draft, hidden, batch, w, 7.0, selector_weight=0.0, options=LossOptions(**options))
        full, _ = block_losses(draft, hidden, batch, w, 7.0, options=LossOptions(**options))
        return float((full - token).detach())

    assert selector_part(selector_weighting="backbone") == pytest.approx(selector_part(), rel=1e-6)  # decay: same
    dpace_own = selector_part(position_weighting="dpace")
    dpace_backbone = selector_part(position_weighting="dpace", selector_weighting="backbone")
    assert dpace_own == pytest.approx(selector_part(), rel=1e-6)       # the selector keeps the decay
    assert dpace_backbone != pytest.approx(dpace_own, rel=1e-3)


def test_config_keys_are_checked_and_old_checkpoints_resume_with_the_old_recipe():
    cfg = TrainConfig.from_dict({"loss": {"position_weighting": "dpace", "dpace_alpha": 0.3,
                                          "selector_weighting": "backbone", "selector_gold": True}})
    assert LossOptions.from_section(cfg.loss) == LossOptions("dpace", 0.3, "backbone", True)
    assert LossOptions.from_section(TrainConfig.from_dict({}).loss) == LossOptions()
    for key, value in (("position_weighting", "cosine"), ("dpace_alpha", 0.0), ("selector_weighting", "own")):
        with pytest.raises(DFlash2Error, match=f"loss.{key}"):
            TrainConfig.from_dict({"loss": {key: value}})
    saved = TrainConfig.from_dict({}).to_dict()
    for key in ("position_weighting", "dpace_alpha", "selector_weighting", "selector_gold"):
        del saved["loss"][key]                                                # a checkpoint from before
        assert f"loss.{key}" in LEGACY_VALUES
    _check_same_config(saved, TrainConfig.from_dict({}).to_dict())
    with pytest.raises(DFlash2Error, match="loss.position_weighting"):
        _check_same_config(saved, cfg.to_dict())
