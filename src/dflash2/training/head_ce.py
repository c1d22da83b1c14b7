"""Cross-entropy through the frozen, shared LM head, chunked and with its gradient fused in.

Contract:
- `head_cross_entropy(hidden, head_weight, labels, *, top_k, chunk, multiplier=1.0, softcap=None)`
  takes draft hidden states hidden [P, H] (requires grad or not), the target's LM head weight
  [V, H] (frozen: it never receives a gradient) and labels [P], and returns
  `(ce [P], top1 [P] bool, cand_ids [P, K])`:
    logits = softcap(multiplier * hidden @ head_weight.T)   (softcap(z) = cap * tanh(z / cap))
    ce     = full-vocabulary cross-entropy of those logits against `labels` (fp32)
    top1   = argmax(logits) == labels;   cand_ids = the K highest logits' token ids.
  Only `ce` carries a gradient (to `hidden`); `top1` and `cand_ids` are plain outputs.
- Cost and memory: the [P, V] logits are never alive at once. Each chunk of `chunk` rows is
  multiplied by the head once; while its logits are in hand, the gradient d ce_p / d hidden_p
  = multiplier * ((softmax - onehot) * softcap') @ head_weight is formed and kept ([P, H]). The
  backward pass only scales those rows by the incoming gradient. Two matmuls per chunk instead of
  the three of recompute-in-backward checkpointing, and no [P, V] activation kept for backward.
- Precision: under torch.autocast (e.g. bf16 on CPU or GPU) both matmuls run in the autocast
  dtype; softmax, CE and the stored gradient are fp32. Without autocast they run in hidden's dtype.
- `candidate_logits(hidden, head_weight, cand_ids, ...)` recomputes the K candidate logits [P, K]
  differentiably (a gather of K head rows, cheap), for losses that need them with a gradient.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    kind = tensor.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return tensor.dtype


def _cap(logits: torch.Tensor, multiplier: float, softcap: float | None) -> torch.Tensor:
    if multiplier != 1.0:
        logits = logits * multiplier
    return torch.tanh(logits / softcap) * softcap if softcap else logits


class _HeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, top_k: int, chunk: int, multiplier: float, softcap, dtype):
        with torch.autocast(hidden.device.type, enabled=False):
            return _HeadCrossEntropy._forward(ctx, hidden, weight, labels, top_k, chunk, multiplier, softcap, dtype)

    @staticmethod
    def _forward(ctx, hidden, weight, labels, top_k, chunk, multiplier, softcap, dtype):
        want_grad = ctx.needs_input_grad[0]
        w = weight.to(dtype)
        rows = hidden.shape[0]
        ce = hidden.new_empty(rows, dtype=torch.float32)
        top1 = torch.empty(rows, dtype=torch.bool, device=hidden.device)
        cand = torch.empty(rows, min(top_k, weight.shape[0]), dtype=torch.long, device=hidden.device)
        grad = hidden.new_empty(rows, hidden.shape[1], dtype=torch.float32) if want_grad else None
        for start in range(0, rows, chunk):
            piece = slice(start, start + chunk)
            raw = (hidden[piece].to(dtype) @ w.T).float()                     # [C, V]
            logits = _cap(raw, multiplier, softcap)
            lab = labels[piece]
            log_probs = torch.log_softmax(logits, dim=-1)                    # [C, V]
            ce[piece] = -log_probs.gather(1, lab[:, None]).squeeze(1)
            top1[piece] = logits.argmax(dim=-1) == lab
            cand[piece] = logits.topk(cand.shape[1], dim=-1).indices
            if want_grad:
                d_logits = log_probs.exp_()                                  # softmax, in place
                d_logits[torch.arange(lab.shape[0], device=lab.device), lab] -= 1.0
                if softcap:                                                  # d cap*tanh(z/cap) / dz
                    d_logits *= 1.0 - (logits / softcap) ** 2
                if multiplier != 1.0:
                    d_logits *= multiplier
                grad[piece] = (d_logits.to(dtype) @ w).float()              # [C, H]
        ctx.save_for_backward(grad)
        ctx.input_dtype = hidden.dtype
        ctx.mark_non_differentiable(top1, cand)
        return ce, top1, cand

    @staticmethod
    def backward(ctx, grad_ce, _grad_top1, _grad_cand):
        (grad,) = ctx.saved_tensors
        grad_hidden = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad * grad_ce[:, None].float()).to(ctx.input_dtype)
        return grad_hidden, None, None, None, None, None, None, None


def head_cross_entropy(hidden: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor, *, top_k: int,
                       chunk: int, multiplier: float = 1.0, softcap: float | None = None):
    """hidden [P, H], head_weight [V, H], labels [P] -> (ce [P], top1 [P], cand_ids [P, K])."""
    return _HeadCrossEntropy.apply(hidden, head_weight.detach(), labels, top_k, chunk, multiplier, softcap,
                                   _compute_dtype(hidden))


def candidate_logits(hidden: torch.Tensor, head_weight: torch.Tensor, cand_ids: torch.Tensor,
                     multiplier: float = 1.0, softcap: float | None = None) -> torch.Tensor:
    """hidden [P, H], cand_ids [P, K] -> the candidates' logits [P, K] (fp32, differentiable)."""
    dtype = _compute_dtype(hidden)
    rows = head_weight.detach()[cand_ids].to(dtype)                          # [P, K, H]
    raw = torch.einsum("pkh,ph->pk", rows, hidden.to(dtype)).float()
    return _cap(raw, multiplier, softcap)
