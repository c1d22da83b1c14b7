"""The fused, chunked LM-head cross-entropy equals the plain one (values, gradient, by-products)."""
import pytest
import torch
import torch.nn.functional as F

from dflash2.training.head_ce import candidate_logits, head_cross_entropy


def _reference_logits(hidden, weight, multiplier, softcap):
    z = (hidden @ weight.T) * multiplier
    return torch.tanh(z / softcap) * softcap if softcap else z


@pytest.mark.parametrize("multiplier,softcap", [(1.0, None), (0.7, None), (1.0, 30.0), (2.0, 5.0)])
@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_matches_plain_cross_entropy(multiplier, softcap, chunk):
    gen = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(37, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(101, 16, dtype=torch.float64, generator=gen)
    labels = torch.randint(0, 101, (37,), generator=gen)
    upstream = torch.rand(37, dtype=torch.float64, generator=gen)

    loss, ce, top1, cand, _ = head_cross_entropy(hidden, weight, labels, top_k=5, chunk=chunk,
                                              multiplier=multiplier, softcap=softcap)
    assert torch.equal(loss, ce)  # no soft targets: the objective is the hard CE
    (loss.double() * upstream).sum().backward()
    fused_grad, hidden.grad = hidden.grad.clone(), None

    logits = _reference_logits(hidden, weight, multiplier, softcap)
    ref = F.cross_entropy(logits, labels, reduction="none")
    (ref * upstream).sum().backward()
    assert torch.allclose(ce.double(), ref, atol=1e-5)
    assert torch.allclose(fused_grad, hidden.grad, atol=1e-5)
    assert torch.equal(top1, logits.argmax(-1) == labels)
    assert torch.equal(cand, logits.topk(5).indices)
    picked = candidate_logits(hidden, weight, cand, multiplier, softcap)
    assert torch.allclose(picked.double(), logits.gather(1, cand), atol=1e-5)


def test_head_weight_gets_no_gradient_and_no_grad_mode_works():
    hidden = torch.randn(5, 8, requires_grad=True)
    weight = torch.randn(20, 8, requires_grad=True)
    labels = torch.randint(0, 20, (5,))
    ce, _, _, _, _ = head_cross_entropy(hidden, weight, labels, top_k=3, chunk=2)
    ce.sum().backward()
    assert weight.grad is None and hidden.grad is not None
    with torch.no_grad():
        again, _, _, _, _ = head_cross_entropy(hidden, weight, labels, top_k=3, chunk=2)
    assert torch.allclose(again, ce.detach())


def test_bf16_autocast_is_close_to_fp32():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(16, 32, generator=gen)
    weight = torch.randn(64, 32, generator=gen) / 4
    labels = torch.randint(0, 64, (16,), generator=gen)
    exact, _, _, _, _ = head_cross_entropy(hidden, weight, labels, top_k=4, chunk=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _, _, _, _ = head_cross_entropy(hidden, weight, labels, top_k=4, chunk=5)
    assert low.dtype == torch.float32
    assert torch.allclose(low, exact, rtol=0.05, atol=0.05)
    assert not torch.equal(low, exact)  # the matmul really ran in bf16


@pytest.mark.parametrize("hard_weight", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_distillation_target_matches_soft_cross_entropy(hard_weight, chunk):
    """loss = CE against hard_weight * onehot(label) + (1 - hard_weight) * the renormalised top-k
    soft target (ids -1 dropped); labels -1 have no hard term; the gradient is that CE's."""
    gen = torch.Generator().manual_seed(chunk)
    rows, vocab, k = 29, 50, 6
    hidden = torch.randn(rows, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, 12, dtype=torch.float64, generator=gen)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    labels[::5] = -1                                               # outside a reduced vocabulary
    soft_ids = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(rows)])
    soft_ids[::3, 0] = -1
    soft_logits = torch.randn(rows, k, generator=gen)
    soft_probs = torch.softmax(soft_logits, -1)
    upstream = torch.rand(rows, dtype=torch.float64, generator=gen)

    loss, ce, top1, _, _ = head_cross_entropy(hidden, weight, labels, top_k=4, chunk=chunk, soft_ids=soft_ids,
                                           soft_probs=soft_probs, hard_weight=hard_weight)
    (loss.double() * upstream).sum().backward()
    fused_grad, hidden.grad = hidden.grad.clone(), None

    target = torch.zeros(rows, vocab, dtype=torch.float64)
    kept = torch.where(soft_ids >= 0, soft_probs.double(), torch.zeros(()).double())
    kept = kept / kept.sum(-1, keepdim=True)
    for r in range(rows):
        for j in range(k):
            if soft_ids[r, j] >= 0:
                target[r, soft_ids[r, j]] += (1 - hard_weight) * kept[r, j]
        if labels[r] >= 0:
            target[r, labels[r]] += hard_weight
    log_probs = torch.log_softmax(hidden @ weight.T, -1)
    ref = -(target * log_probs).sum(-1)
    (ref * upstream).sum().backward()
    assert torch.allclose(loss.double(), ref, atol=1e-5)
    assert torch.allclose(fused_grad, hidden.grad, atol=1e-5)
    valid = labels >= 0
    hard = -log_probs.gather(1, labels.clamp(min=0)[:, None])[:, 0] * valid
    assert torch.allclose(ce.double(), hard.detach(), atol=1e-5)   # `ce` stays the hard CE, 0 off-vocabulary
    assert not top1[~valid].any()
