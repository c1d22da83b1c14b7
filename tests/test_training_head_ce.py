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

    ce, top1, cand = head_cross_entropy(hidden, weight, labels, top_k=5, chunk=chunk,
                                        multiplier=multiplier, softcap=softcap)
    (ce.double() * upstream).sum().backward()
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
    ce, _, _ = head_cross_entropy(hidden, weight, labels, top_k=3, chunk=2)
    ce.sum().backward()
    assert weight.grad is None and hidden.grad is not None
    with torch.no_grad():
        again, _, _ = head_cross_entropy(hidden, weight, labels, top_k=3, chunk=2)
    assert torch.allclose(again, ce.detach())


def test_bf16_autocast_is_close_to_fp32():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(16, 32, generator=gen)
    weight = torch.randn(64, 32, generator=gen) / 4
    labels = torch.randint(0, 64, (16,), generator=gen)
    exact, _, _ = head_cross_entropy(hidden, weight, labels, top_k=4, chunk=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _, _ = head_cross_entropy(hidden, weight, labels, top_k=4, chunk=5)
    assert low.dtype == torch.float32
    assert torch.allclose(low, exact, rtol=0.05, atol=0.05)
    assert not torch.equal(low, exact)  # the matmul really ran in bf16
