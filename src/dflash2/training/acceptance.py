"""The acceptance ("LK") loss: training the draft on speculative sampling's acceptance probability.

Contract (pure functions, no state):
- Speculative sampling accepts a draft token drawn from q with probability
  alpha = sum_x min(p(x), q(x)) (p the target's distribution, q the draft's), so -log alpha is a
  loss on acceptance itself (LK losses, arXiv 2602.23881), where the CE / KL losses only reach it
  through a proxy.
- Here p is the target's top-k distribution that the trainer keeps for distillation
  (`loss.distill_top_k`): the softmax of its k highest logits, renormalised on those k ids. The
  target's mass outside its top-k is ignored, so alpha_k = sum over the top-k ids of
  min(p_k(x), q(x)) is the acceptance rate against a target that samples with top_k = k; for the
  real target, with P_k its (unstored) mass on those k ids, alpha >= P_k * alpha_k (a lower bound
  that is tight for a peaked target; P_k = 1 makes alpha_k itself a lower bound of alpha).
- q is the draft's full softmax (over its own vocabulary, after the LM head's multiplier and
  softcap) read at the target's top-k ids; an id the draft cannot propose (outside a reduced
  draft vocabulary: draft id -1) has q = 0 and adds nothing.
- `acceptance_rate(draft_probs, teacher_probs)` -> alpha_k; `acceptance_logit_grad(probs, ids,
  teacher_probs)` -> (alpha_k, d(-log alpha_k)/d logits) for the chunked LM-head loss
  (`head_ce`), in closed form so no [P, V] graph is kept: with S = {ids where q < p} (where min
  picks q) and Q_S = sum_S q,  d(-log alpha)/dz_j = q_j * (Q_S - [j in S]) / alpha.
"""
from __future__ import annotations

import torch

ALPHA_FLOOR = 1e-12    # -log alpha stays finite where no top-k id is draftable (alpha 0, gradient 0)


def acceptance_rate(draft_probs: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """draft_probs [..., k] q at the target's top-k ids (0 where not draftable), teacher_probs
    [..., k] p on those ids -> alpha [...] = sum_k min(p, q)."""
    return torch.minimum(draft_probs, teacher_probs).sum(-1)


def draft_probs_at(probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """probs [C, V] the draft's softmax, ids [C, k] draft ids (-1: not draftable) -> q [C, k]."""
    return probs.gather(1, ids.clamp(min=0)) * (ids >= 0)


def acceptance_logit_grad(probs: torch.Tensor, ids: torch.Tensor,
                          teacher_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [C, V] the draft's softmax (fp32), ids [C, k] draft ids (-1: not draftable),
    teacher_probs [C, k] -> (alpha [C], the gradient of -log alpha with respect to the logits [C, V])."""
    q = draft_probs_at(probs, ids)                                            # [C, k]
    alpha = acceptance_rate(q, teacher_probs)                                 # [C]
    under = q * (q < teacher_probs)                                           # [C, k] q on S, else 0
    inverse = 1.0 / alpha.clamp(min=ALPHA_FLOOR)                              # [C]
    grad = probs * (under.sum(-1) * inverse)[:, None]                         # [C, V] q_j * Q_S / alpha
    grad.scatter_add_(1, ids.clamp(min=0), -under * inverse[:, None])         # - q_j / alpha on S
    return alpha, grad


def acceptance_loss(alpha: torch.Tensor) -> torch.Tensor:
    """alpha [...] -> -log alpha [...] (floored, finite)."""
    return -torch.log(alpha.clamp(min=ALPHA_FLOOR))
