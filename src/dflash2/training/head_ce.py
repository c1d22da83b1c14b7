"""Cross-entropy through the frozen, shared LM head, chunked and with its gradient fused in.

Contract:
- `head_cross_entropy(hidden, head_weight, labels, *, top_k, chunk, multiplier=1.0, softcap=None,
  soft_ids=None, soft_probs=None, hard_weight=1.0, acceptance_weight=0.0)` takes draft hidden states hidden [P, H]
  (requires grad or not), the LM head rows the draft scores [V, H] (the target's whole head, or the
  rows of a reduced draft vocabulary; frozen: it never receives a gradient) and labels [P] (indices
  into those rows, -1 for a label the head cannot produce), and returns
  `(loss [P], ce [P], top1 [P] bool, cand_ids [P, K], alpha [P])`:
    logits = softcap(multiplier * hidden @ head_weight.T)   (softcap(z) = cap * tanh(z / cap))
    ce     = cross-entropy of those logits against `labels` (fp32; 0 where the label is -1)
    loss   = cross-entropy against the mixed target  hard_weight * onehot(label)
             + (1 - hard_weight) * soft, where soft [P, k] puts `soft_probs` on `soft_ids` (the
             target's own top-k distribution, ids -1 dropped): distillation. Without soft targets
             loss = ce.  top1 = argmax(logits) == labels;  cand_ids = the K highest logits' indices.
    alpha  = the draft's teacher-forced acceptance rate against the soft target,
             sum_k min(soft_probs, softmax(logits)[soft_ids]) (`acceptance.acceptance_rate`; ids -1
             count 0, soft_probs NOT renormalised on the head's ids); 0 without soft targets.
    With `acceptance_weight` w > 0 (needs soft targets):
             loss = (1 - w) * the cross-entropy above + w * (-log alpha)   (the LK loss);
             w = 0 leaves the loss and its gradient bit for bit as without the option.
  Only `loss` carries a gradient (to `hidden`); the other outputs are plain.
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

from dflash2.errors import require
from dflash2.training.acceptance import acceptance_loss, acceptance_logit_grad, acceptance_rate


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
    def forward(ctx, hidden, weight, labels, soft_ids, soft_probs, hard_weight: float, acceptance_weight: float,
                top_k: int, chunk: int, multiplier: float, softcap, dtype):
        with torch.autocast(hidden.device.type, enabled=False):
            return _HeadCrossEntropy._forward(ctx, hidden, weight, labels, soft_ids, soft_probs, hard_weight,
                                              acceptance_weight, top_k, chunk, multiplier, softcap, dtype)

    @staticmethod
    def _forward(ctx, hidden, weight, labels, soft_ids, soft_probs, hard_weight, acceptance_weight, top_k, chunk,
                 multiplier, softcap, dtype):
        want_grad = ctx.needs_input_grad[0]
        w = weight.to(dtype)
        rows = hidden.shape[0]
        ce = hidden.new_empty(rows, dtype=torch.float32)
        loss = hidden.new_empty(rows, dtype=torch.float32)
        alpha = hidden.new_zeros(rows, dtype=torch.float32)
        top1 = torch.empty(rows, dtype=torch.bool, device=hidden.device)
        cand = torch.empty(rows, min(top_k, weight.shape[0]), dtype=torch.long, device=hidden.device)
        grad = hidden.new_empty(rows, hidden.shape[1], dtype=torch.float32) if want_grad else None
        for start in range(0, rows, chunk):
            piece = slice(start, start + chunk)
            raw = (hidden[piece].to(dtype) @ w.T).float()                     # [C, V]
            logits = _cap(raw, multiplier, softcap)
            lab = labels[piece]
            valid = lab >= 0
            log_probs = torch.log_softmax(logits, dim=-1)                    # [C, V]
            target = _target_distribution(lab, valid, None if soft_ids is None else soft_ids[piece],
                                          None if soft_probs is None else soft_probs[piece], hard_weight,
                                          logits.shape[-1])                  # [C, V] or None (pure hard)
            ce[piece] = -log_probs.gather(1, lab.clamp(min=0)[:, None]).squeeze(1) * valid
            loss[piece] = ce[piece] if target is None else -(target * log_probs).sum(-1)
            if soft_ids is not None:
                ids, p = soft_ids[piece], soft_probs[piece].float()                 # [C, k]
                q = log_probs.gather(1, ids.clamp(min=0)).exp() * (ids >= 0)         # [C, k]
                alpha[piece] = acceptance_rate(q, p)
                if acceptance_weight > 0:
                    loss[piece] = (1.0 - acceptance_weight) * loss[piece] + \
                        acceptance_weight * acceptance_loss(alpha[piece])
            top1[piece] = (logits.argmax(dim=-1) == lab) & valid
            cand[piece] = logits.topk(cand.shape[1], dim=-1).indices
            if want_grad:
                d_logits = log_probs.exp_()                                  # softmax, in place
                if acceptance_weight > 0:                                    # d(-log alpha)/dz, before d_logits changes
                    d_accept = acceptance_logit_grad(d_logits, ids, p)[1]   # [C, V]
                if target is None:
                    d_logits *= valid[:, None]
                    d_logits[torch.arange(lab.shape[0], device=lab.device), lab.clamp(min=0)] -= valid.float()
                else:                                                        # d/dz of -sum t log softmax(z)
                    d_logits *= target.sum(-1, keepdim=True)
                    d_logits -= target
                if acceptance_weight > 0:
                    d_logits.mul_(1.0 - acceptance_weight).add_(d_accept, alpha=acceptance_weight)
                if softcap:                                                  # d cap*tanh(z/cap) / dz
                    d_logits *= 1.0 - (logits / softcap) ** 2
                if multiplier != 1.0:
                    d_logits *= multiplier
                grad[piece] = (d_logits.to(dtype) @ w).float()              # [C, H]
        ctx.save_for_backward(grad)
        ctx.input_dtype = hidden.dtype
        ctx.mark_non_differentiable(ce, top1, cand, alpha)
        return loss, ce, top1, cand, alpha

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_top1, _grad_cand, _grad_alpha):
        (grad,) = ctx.saved_tensors
        grad_hidden = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad * grad_loss[:, None].float()).to(ctx.input_dtype)
        return (grad_hidden,) + (None,) * 11


def _target_distribution(labels, valid, soft_ids, soft_probs, hard_weight: float, vocab: int):
    """[C, V] mixed target of the distillation loss (None when it is the plain one-hot label)."""
    if soft_ids is None or hard_weight >= 1.0:
        return None
    target = torch.zeros(labels.shape[0], vocab, dtype=torch.float32, device=labels.device)
    keep = soft_ids >= 0
    probs = soft_probs.float() * keep
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)             # renormalised on the head's ids
    target.scatter_add_(1, soft_ids.clamp(min=0), (1.0 - hard_weight) * probs)
    rows = torch.arange(labels.shape[0], device=labels.device)
    target[rows, labels.clamp(min=0)] += hard_weight * valid.float()
    return target


def head_cross_entropy(hidden: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor, *, top_k: int,
                       chunk: int, multiplier: float = 1.0, softcap: float | None = None,
                       soft_ids: torch.Tensor | None = None, soft_probs: torch.Tensor | None = None,
                       hard_weight: float = 1.0, acceptance_weight: float = 0.0):
    """hidden [P, H], head_weight [V, H], labels [P] -> (loss [P], ce [P], top1 [P], cand_ids [P, K], alpha [P])."""
    require(acceptance_weight == 0 or soft_ids is not None, "the acceptance loss needs the target's top-k (soft_ids)")
    return _HeadCrossEntropy.apply(hidden, head_weight.detach(), labels, soft_ids, soft_probs, hard_weight,
                                   acceptance_weight, top_k, chunk, multiplier, softcap, _compute_dtype(hidden))


def candidate_logits(hidden: torch.Tensor, head_weight: torch.Tensor, cand_ids: torch.Tensor,
                     multiplier: float = 1.0, softcap: float | None = None) -> torch.Tensor:
    """hidden [P, H], cand_ids [P, K] -> the candidates' logits [P, K] (fp32, differentiable)."""
    dtype = _compute_dtype(hidden)
    rows = head_weight.detach()[cand_ids].to(dtype)                          # [P, K, H]
    raw = torch.einsum("pkh,ph->pk", rows, hidden.to(dtype)).float()
    return _cap(raw, multiplier, softcap)
