"""Acceptance rules of speculative decoding, as small pure functions (SPEC §3).

Contract (all tensors fp32, `T` drafted positions, vocabulary `V`):
- `target_probs(logits, temperature, top_k, top_p)`: the target's processed distribution,
  temperature first, then top-k, then top-p (nucleus; the most likely token always stays).
- `greedy_accept(draft, target_argmax)`: number of leading drafts equal to the target's argmax.
- `sample_accept(draft, p, q, generator)`: the exact rule. Draft token d_i, drawn from q_i, is
  accepted iff u_i * q_i(d_i) < p_i(d_i); at the first rejection the correction token is drawn from
  norm(max(p_i - q_i, 0)) (p_i itself if that residual is all zero); if all T are accepted the bonus
  is drawn from p_T. The output then follows p exactly, whatever q is.
- `dense_q(candidate_ids, q_candidates, vocab_size)`: scatter a selector's distribution over its K
  candidates into the vocabulary (0 elsewhere).
"""
from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] after temperature, top-k, top-p."""
    scores = logits.float() / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs   # mass of strictly better tokens
        drop_sorted = mass_before >= top_p                         # the top token has mass_before 0
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def greedy_accept(draft: torch.Tensor, target_argmax: torch.Tensor) -> torch.Tensor:
    """draft [b, T], target_argmax [b, >=T] -> accepted count [b] (longest matching prefix)."""
    matches = (draft == target_argmax[:, : draft.shape[1]]).long()
    return matches.cumprod(dim=1).sum(dim=1)


def sample_accept(draft: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """draft [b, T], p [b, T+1, V], q [b, T, V] -> (accepted count [b], next token [b])."""
    b, t_len = draft.shape
    rows = torch.arange(b, device=draft.device)
    p_draft = p[:, :t_len].gather(-1, draft.unsqueeze(-1)).squeeze(-1)     # [b, T]
    q_draft = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)                 # [b, T]
    u = torch.rand(b, t_len, generator=generator, device=draft.device)
    accepted = (u * q_draft < p_draft).long().cumprod(dim=1).sum(dim=1)     # [b]
    # Distribution of the next token: residual at the first rejection, p_T after a full accept.
    position = accepted.clamp(max=t_len - 1)
    residual = (p[rows, position] - q[rows, position]).clamp(min=0)
    residual_mass = residual.sum(-1, keepdim=True)
    residual = torch.where(residual_mass > 0, residual / residual_mass.clamp(min=1e-30), p[rows, position])
    next_dist = torch.where((accepted == t_len)[:, None], p[:, t_len], residual)
    next_token = torch.multinomial(next_dist, 1, generator=generator).squeeze(-1)
    return accepted, next_token


def dense_q(candidate_ids: torch.Tensor, q_candidates: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """candidate_ids / q_candidates [..., K] -> [..., V] with zeros off the candidates."""
    dense = torch.zeros(*candidate_ids.shape[:-1], vocab_size, dtype=torch.float32, device=candidate_ids.device)
    return dense.scatter_(-1, candidate_ids, q_candidates.float())
