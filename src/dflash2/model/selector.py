"""Path selector over the draft's top-K candidates (DFlash2, docs/spec.md §2.4).

Contract: for block positions t = 1..B-1 with draft hidden states h_t (after the final norm) and
top-K candidates c_t with unary scores U_t (the draft logits),

    S_t(a, b) = U_t(b) + sum_r A[a, r] * (W_h h_t)_r * B[b, r]

where A / B are the predecessor / successor codebooks [V, r]. `pair_scores` computes all K x K
scores of all positions in one batched product (the predecessor of position 1 is the anchor).
`walk` then goes once left to right: greedy takes the arg-max successor of the chosen predecessor
(ties to the lower index); sampling at temperature T draws from q_t = softmax(S_t(prev, .) / T)
and returns q_t, so acceptance can be exact; greedy and sampled rows can share a batch. Initialisation: successor codebook 0 and predecessor
~ N(0, 0.02), so a fresh selector scores exactly the plain logits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dflash2.model.packing import project, repack

from dflash2.runtime.rng import sample_from


@dataclass
class SelectedPath:
    tokens: torch.Tensor         # [b, T] chosen draft token ids for block positions 1..T
    candidate_ids: torch.Tensor  # [b, T, K] the candidate lists the tokens were chosen from
    q: torch.Tensor | None       # [b, T, K] distribution each token was drawn from (None: all greedy)
    confidence: torch.Tensor     # [b, T] the walk's probability of each chosen token


@dataclass
class SecondPath:
    tokens: torch.Tensor         # [b, T] the main path's tokens before `fork`, the second path's from it
    fork: torch.Tensor           # [b] the first position (0-based) where it leaves the main path
    confidence: torch.Tensor     # [b, T] the walk's probability of each token (the runner-up's at the fork)


class CandidateSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int = 256, top_k: int = 16):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.packed_gate = None   # `pack`: an inference copy of hidden_projection (`model.packing`)
        self.reset_parameters()

    def pack(self) -> None:
        self.packed_gate = repack(self.packed_gate, self.hidden_projection.weight)

    def reset_parameters(self) -> None:
        if self.predecessor_codebook.is_meta:  # built to be loaded: random init on meta imports torch._dynamo (1 s)
            return
        nn.init.normal_(self.predecessor_codebook, std=0.02)
        nn.init.zeros_(self.successor_codebook)
        nn.init.normal_(self.hidden_projection.weight, std=0.02)

    def scores_given_predecessors(self, hidden: torch.Tensor, predecessor_ids: torch.Tensor,
                                  candidate_ids: torch.Tensor, candidate_logits: torch.Tensor) -> torch.Tensor:
        """Scores of K candidates given P predecessors per position.

        hidden [..., H], predecessor_ids [..., P], candidate_ids / candidate_logits [..., K]
        -> scores [..., P, K] (fp32).
        """
        gate = project(hidden, self.packed_gate, self.hidden_projection.weight)[0].float()                       # [..., r]
        pred = self.predecessor_codebook[predecessor_ids].float() * gate.unsqueeze(-2)  # [..., P, r]
        succ = self.successor_codebook[candidate_ids].float()               # [..., K, r]
        return candidate_logits.float().unsqueeze(-2) + pred @ succ.transpose(-1, -2)

    def pair_scores(self, hidden: torch.Tensor, anchor_ids: torch.Tensor, candidate_ids: torch.Tensor,
                    candidate_logits: torch.Tensor) -> torch.Tensor:
        """All pair scores of a block: hidden [b, T, H], anchor_ids [b], candidates [b, T, K]
        -> [b, T, K_prev, K]; row i of position t is predecessor candidate_ids[:, t-1, i]
        (for t = 0 every row is the anchor)."""
        k = candidate_ids.shape[-1]
        anchor = anchor_ids[:, None, None].expand(-1, 1, k)                     # [b, 1, K]
        predecessors = torch.cat([anchor, candidate_ids[:, :-1]], dim=1)          # [b, T, K]
        return self.scores_given_predecessors(hidden, predecessors, candidate_ids, candidate_logits)

    @staticmethod
    def walk(scores: torch.Tensor, candidate_ids: torch.Tensor, temperature, u: torch.Tensor | None = None
             ) -> SelectedPath:
        """Left-to-right walk through pair scores [b, T, K, K]; returns the chosen path.

        `temperature` is a number or a [b] tensor (0 = greedy for that row); sampled rows draw
        their pick at position t by inverse CDF with u[:, t] (u [b, T], required when any row
        samples; without u every row walks greedily, and no host synchronisation is needed to
        tell). `confidence` [b, T] is the walk's probability of each pick: q_t(pick) for sampled
        rows, softmax(S_t(prev, .))(pick) for greedy rows; `q` is returned when u is given."""
        b, t_len, k, _ = scores.shape
        temps = torch.as_tensor(temperature, dtype=torch.float32, device=scores.device).expand(b)
        greedy = temps <= 0
        sampling = u is not None
        scale = torch.where(greedy, torch.ones_like(temps), temps)[:, None, None, None]   # [b, 1, 1, 1]
        # Every predecessor's successor distribution and choice at once; the walk then only follows
        # its picks (the row of the pick before): the same rows, draws and ties as one row at a time.
        table = scores.float()                                                  # [b, T, K_prev, K]
        q_all = torch.softmax(table / scale, dim=-1)
        step = table.argmax(dim=-1)  # [b, T, K_prev] first maximum: ties go to the lower index
        if sampling:   # the pick each predecessor's row would draw with u[:, t]
            step = torch.where(greedy[:, None, None], step, sample_from(q_all, u[:, :, None].expand(b, t_len, k)))
        prev = torch.zeros(b, 1, dtype=torch.long, device=scores.device)
        came_from, chosen = [], []
        for t in range(t_len):
            came_from.append(prev)
            prev = step[:, t].gather(1, prev)                                   # [b, 1]
            chosen.append(prev)
        picks, preds = torch.cat(chosen, dim=1), torch.cat(came_from, dim=1)     # [b, T]
        q = q_all.gather(2, preds[:, :, None, None].expand(b, t_len, 1, k)).squeeze(2)   # [b, T, K] the rows walked
        tokens = candidate_ids.gather(-1, picks.unsqueeze(-1)).squeeze(-1)
        return SelectedPath(tokens, candidate_ids, q if sampling else None, q.gather(-1, picks.unsqueeze(-1)).squeeze(-1))

    @staticmethod
    def second_path(scores: torch.Tensor, candidate_ids: torch.Tensor, main: SelectedPath) -> SecondPath:
        """The lattice's second greedy path: it follows `main` (a greedy walk of these scores) up to
        the fork j, takes the runner-up successor there and walks greedily on. j maximises
        reach_j * p2_j, the walk's probability of reaching j on the main path (the product of its
        confidences before j) times the runner-up's probability at j: where a second branch is most
        likely to be the one accepted. scores [b, T, K, K] -> `SecondPath` (tokens [b, T], fork [b],
        the branch's confidence [b, T], its nodes past the fork valid from `fork` on)."""
        b, t_len, k, _ = scores.shape
        rows = torch.arange(b, device=scores.device)
        picks = (candidate_ids == main.tokens.unsqueeze(-1)).float().argmax(-1)        # [b, T] index in the lists
        prev = torch.cat([torch.zeros_like(picks[:, :1]), picks[:, :-1]], dim=1)        # [b, T] predecessor index
        rows_t = scores.gather(2, prev[:, :, None, None].expand(-1, -1, 1, k))[:, :, 0].float()  # [b, T, K]
        probs = torch.softmax(rows_t, dim=-1)
        runner_up = probs.topk(min(2, k), dim=-1)                                       # [b, T, 2]
        reach = torch.cat([torch.ones_like(main.confidence[:, :1]),
                           main.confidence[:, :-1].float().cumprod(-1)], dim=1)        # [b, T]
        second_p = runner_up.values[..., -1] if k > 1 else torch.zeros_like(reach)
        fork = (reach * second_p).argmax(-1)                                            # [b]
        tokens, confidence = main.tokens.clone(), main.confidence.clone().float()
        current = runner_up.indices[rows, fork, -1]                                     # [b] the runner-up at j
        tokens[rows, fork] = candidate_ids[rows, fork, current]
        confidence[rows, fork] = second_p[rows, fork]
        for t in range(1, t_len):                                                       # greedy past the fork
            past = fork < t
            if not bool(past.any()):
                continue
            row = scores[rows, t, current].float()                                      # [b, K]
            pick = row.argmax(-1)
            q = torch.softmax(row, dim=-1).gather(-1, pick[:, None])[:, 0]
            tokens[:, t] = torch.where(past, candidate_ids[rows, t, pick], tokens[:, t])
            confidence[:, t] = torch.where(past, q, confidence[:, t])
            current = torch.where(past, pick, current)
        return SecondPath(tokens, fork, confidence)
