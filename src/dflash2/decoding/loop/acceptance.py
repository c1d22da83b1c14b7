"""Acceptance rules of speculative decoding, as small pure functions (docs/spec.md §3).

Contract (probabilities fp32, `T` drafted positions, vocabulary `V`, batch `b`):
- `target_probs(logits, temperature, top_k, top_p)`: the target's processed distribution,
  temperature first, then top-k, then top-p (nucleus; the most likely token always stays). The
  settings are per row ([b] tensors) or plain numbers for the whole batch; a row with
  temperature 0 gets the distribution at temperature 1 (greedy rows never sample from it).
- `greedy_accept(draft, target_argmax, limit)`: number of leading drafts equal to the target's
  argmax, at most `limit[r]` for row r (the draft length verified for that row).
- `sample_accept(draft, p, q, u_accept, u_token, limit)`: the exact rule. Draft token d_i, drawn
  from q_i, is accepted iff u_i * q_i(d_i) < p_i(d_i); at the first rejection the next token is
  drawn from norm(max(p_i - q_i, 0)) (p_i itself if that residual is all zero); if all `limit[r]`
  verified drafts are accepted the bonus is drawn from p at the position after them. The output
  then follows p exactly, whatever q is. Uniforms are inputs (see `rng.uniforms`), so the
  rule is a pure function of its arguments.
- `dense_q(candidate_ids, q_candidates, vocab_size)`: scatter a selector's distribution over its K
  candidates into the vocabulary (0 elsewhere).
A limit of None means every drafted position is verified.
"""
from __future__ import annotations

import torch

from dflash2.runtime.rng import sample_from


def _per_row(value, logits: torch.Tensor, dtype) -> torch.Tensor:
    """A setting (number or [b] tensor) broadcast against logits [b, ..., V]."""
    value = torch.as_tensor(value, dtype=dtype, device=logits.device)
    if value.dim() == 0:
        value = value.expand(logits.shape[0])
    return value.view(-1, *([1] * (logits.dim() - 1)))


def target_probs(logits: torch.Tensor, temperature, top_k=0, top_p=1.0) -> torch.Tensor:
    """logits [b, ..., V] -> probabilities [b, ..., V] after temperature, top-k, top-p."""
    t = _per_row(temperature, logits, torch.float32)
    scores = logits.float() / torch.where(t > 0, t, torch.ones_like(t))
    k = _per_row(top_k, logits, torch.int64)
    vocab = scores.shape[-1]
    if bool(((k > 0) & (k < vocab)).any()):
        top = int(k.clamp(max=vocab).max())
        values = scores.topk(top, dim=-1).values                               # [..., top]
        kth = values.gather(-1, (k.clamp(min=1, max=top) - 1).expand(*values.shape[:-1], 1))
        keep_all = (k <= 0) | (k >= vocab)
        scores = scores.masked_fill((scores < kth) & ~keep_all, float("-inf"))
    p_cut = _per_row(top_p, logits, torch.float32)
    if bool((p_cut < 1.0).any()):
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs   # mass of strictly better tokens
        drop_sorted = mass_before >= p_cut                         # the top token has mass_before 0
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def _limits(limit, draft: torch.Tensor) -> torch.Tensor:
    if limit is None:
        return torch.full((draft.shape[0],), draft.shape[1], dtype=torch.long, device=draft.device)
    return torch.as_tensor(limit, dtype=torch.long, device=draft.device).clamp(0, draft.shape[1])


def greedy_accept(draft: torch.Tensor, target_argmax: torch.Tensor, limit=None) -> torch.Tensor:
    """draft [b, T], target_argmax [b, >=T] -> accepted count [b] (longest matching prefix)."""
    matches = (draft == target_argmax[:, : draft.shape[1]]).long()
    return torch.minimum(matches.cumprod(dim=1).sum(dim=1), _limits(limit, draft))


def sample_accept(draft: torch.Tensor, p: torch.Tensor, q: torch.Tensor, u_accept: torch.Tensor,
                  u_token: torch.Tensor, limit=None) -> tuple[torch.Tensor, torch.Tensor]:
    """draft [b, T], p [b, T+1, V], q [b, T, V], u_accept [b, T], u_token [b, T+1]
    -> (accepted count [b], next token [b])."""
    b, t_len = draft.shape
    rows = torch.arange(b, device=draft.device)
    limits = _limits(limit, draft)
    p_draft = p[:, :t_len].gather(-1, draft.unsqueeze(-1)).squeeze(-1)     # [b, T]
    q_draft = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)                 # [b, T]
    passed = (u_accept.to(p_draft.dtype) * q_draft < p_draft).long().cumprod(dim=1).sum(dim=1)
    accepted = torch.minimum(passed, limits)                                # [b]
    # Distribution of the next token: residual at the first rejection, p after the verified drafts.
    position = accepted.clamp(max=max(t_len - 1, 0))
    residual = (p[rows, position] - q[rows, position]).clamp(min=0) if t_len else p[:, 0]
    residual_mass = residual.sum(-1, keepdim=True)
    residual = torch.where(residual_mass > 0, residual / residual_mass.clamp(min=1e-30), p[rows, position])
    next_dist = torch.where((accepted == limits)[:, None], p[rows, limits], residual)
    next_token = sample_from(next_dist, u_token[rows, accepted])
    return accepted, next_token


def dense_q(candidate_ids: torch.Tensor, q_candidates: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """candidate_ids / q_candidates [..., K] -> [..., V] with zeros off the candidates."""
    dense = torch.zeros(*candidate_ids.shape[:-1], vocab_size, dtype=torch.float32, device=candidate_ids.device)
    return dense.scatter_(-1, candidate_ids, q_candidates.float())
