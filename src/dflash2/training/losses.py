"""Training losses and teacher-forced metrics of a packed batch of draft blocks (docs/spec.md §4).

Contract:
- `block_losses(draft, hidden, batch, weights, normaliser, ...)` takes the draft's final-norm
  hidden states [b, N, B, H] of a packed batch and the fixed position weights [B-1]
  (`weighting.position_weights`), and returns `(loss, stats)`:
    loss  = (sum_p v_p * L_p  +  selector_weight * sum_p u_p * SelCE_p) / normaliser
  over the supervised block positions p (k = 1..B-1 of real blocks). v_p, the token loss's weight,
  is the fixed decay w_k (`position_weighting="decay"`) or the D-PACE weight of p computed from
  the draft's own detached confidence in the true tokens of its block (`"dpace"`,
  `weighting.dpace_weights`, smoothing `dpace_alpha`). u_p, the selector loss's weight, is the
  fixed decay (`selector_weighting="decay"`) or v_p (`"backbone"`: weighted like the token loss).
  `normaliser` is the caller's sum of `weighting.step_share` over the WHOLE optimiser step (all
  micro-batches, all ranks), so gradient accumulation and data parallelism reproduce the
  single-batch loss exactly.
  L_p is the cross-entropy of the draft logits (over the draft's vocabulary: the target's, or a
  reduced one) against the mixed target (1 - distill_weight) * onehot(true token) + distill_weight *
  the target's own top-k distribution at that position (`Teacher`; distillation, a forward KL up
  to the target's entropy). With distill_weight 0 it is the hard CE on the true token, CE_p, which
  is what the `ce` statistic reports in every case (comparable across recipes). With
  `acceptance_weight` w > 0 (the LK loss, `training.acceptance`) L_p becomes
  (1 - w) * that cross-entropy + w * (-log alpha_p), alpha_p = sum over the target's top-k ids of
  min(p, q): the probability that speculative sampling accepts the draft's token at p (against
  the target's top-k distribution; its mass outside the top-k is ignored). w = 0 is the recipe
  without the option, bit for bit. Whenever a teacher is given, the `alpha` statistic is the
  teacher-forced alpha_p, summed with the fixed decay weights like `ce`. A true token
  outside a reduced vocabulary cannot be drafted: it has no hard term, counts in the normaliser,
  has confidence 0 for D-PACE, and is never a top-1 / top-K hit.
  SelCE_p is the selector's cross-entropy over the top-K candidates of the draft logits, with the
  TRUE previous token as predecessor (the anchor for k = 1). Where the true token is not among the
  top K it is 0 (its weight still counts in the normaliser), unless `selector_gold`: then the
  true token replaces the weakest (K-th) candidate in that loss, so the selector also learns from
  the positions its candidates miss. Its metrics (`selector_ok`, the `selector` statistic) keep
  the serving semantics: the real top K only.
- Gradient of the selector loss: by default it trains the selector only (codebooks and
  hidden_projection); the draft hidden state and unary logits enter it detached, so the backbone is
  shaped by the token CE alone and the selector cannot trade token accuracy for pair scores.
  `selector_grad_to_backbone=True` lets it flow into the backbone too (an ablation switch).
- Memory and cost: the token CE goes through `head_ce.head_cross_entropy`, which builds logits
  CHUNK positions at a time and forms their gradient on the spot, so at most one chunk's [chunk, V]
  fp32 logits are alive and the LM head is multiplied twice per chunk (forward, gradient).
- `options` is a `LossOptions` (the choices above; default: fixed decay, no gold candidate, no
  acceptance loss).
- `stats` is a `LossStats` of detached float64 sums, always with the fixed decay weights whatever
  the objective's weights (so the logged CE and selector CE compare across recipes): `a + b` adds micro-batches and steps,
  `reduced(dist)` sums them across ranks (one all_reduce of one packed vector), and
  `summary(selector_weight, has_selector)` turns them into the logged metrics: loss parts,
  teacher-forced acceptance length (tau with the selector walk, tau_base with per-position argmax),
  per-position top-1, top-K and selector accuracy, `loss_selector_in_topk` (the selector CE
  averaged over the positions it applies to; `loss_selector` is normalised like the token CE, so it
  grows with recall) and, when the batches had a teacher, `acceptance_alpha` (the weighted mean
  teacher-forced alpha_p).
- `block_losses(..., with_outcome=True)` also returns a `BlockOutcome` per block (detached,
  [b, N]): `accepted`, the number of leading positions the acceptance path gets right (the
  selector's walk with a selector, else the argmax: the count tau is built from), and `near_miss`,
  true where that path fails at a supervised label of a real block that is among the draft's top-K
  candidates there (`training.replay` keeps such blocks to train on again).
- With `batch.replayed` set (blocks drawn from the replay buffer), the acceptance statistics
  (`blocks`, `tau`, `tau_base`, per-position `count` / `top1` / `topk` / `selector_ok`) count the
  uniformly drawn blocks only, so they compare with runs without replay; the loss and its CE /
  selector sums cover every block trained on.
- Teacher-forced tau of a block = 1 + number of leading positions predicted correctly. With the
  true previous token as predecessor this equals the greedy acceptance length against the labels
  (while the walk is right its chosen predecessor IS the true token). Blocks whose labels stop
  early (end of the response) count only their supervised positions.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from dflash2.errors import require
from dflash2.training.batches import Batch
from dflash2.training.head_ce import candidate_logits, head_cross_entropy
from dflash2.training.weighting import dpace_weights, label_weights

if TYPE_CHECKING:
    from dflash2.training.distributed import Dist


@dataclass
class Teacher:
    """The target's own next-token distribution at each label of a batch, for distillation: its
    top-k token ids and logits, ids / logits [b, N, B-1, k] (the prediction made at position
    anchor + j - 1 of the token at anchor + j)."""
    ids: torch.Tensor
    logits: torch.Tensor


@dataclass(frozen=True)
class LossOptions:
    """How the block loss weighs its labels and builds the selector's targets (`loss.*` config keys
    of the same names; the defaults are the recipe before these options existed)."""

    position_weighting: str = "decay"    # token-loss weights: "decay" (fixed) or "dpace" (confidence)
    dpace_alpha: float = 0.5             # D-PACE confidence smoothing
    selector_weighting: str = "decay"    # selector-loss weights: "decay" or "backbone" (the token loss's)
    selector_gold: bool = False          # a true token missing from the top K replaces the K-th in the selector loss
    acceptance_weight: float = 0.0       # share of -log alpha (the LK loss) in the token loss; needs a teacher

    @classmethod
    def from_section(cls, loss) -> "LossOptions":
        """From a `LossSection` (config.py)."""
        return cls(**{f.name: getattr(loss, f.name) for f in fields(cls)})


@dataclass
class LossStats:
    """Detached sums over supervised block positions, blocks and (after `+`) micro-batches, steps
    and ranks. Every field is a tensor: [] scalars, and [T] (per block position 1..B-1) for `count`,
    `top1`, `topk`, `selector_ok`. Sums of two stats are float64."""

    weight: torch.Tensor         # [] label weights (the loss normaliser)
    weight_topk: torch.Tensor    # [] label weights where the true token is among the top K
    ce: torch.Tensor             # [] weighted token CE
    selector: torch.Tensor       # [] weighted selector CE
    alpha: torch.Tensor          # [] weighted teacher-forced acceptance rate alpha_p (with a teacher)
    weight_alpha: torch.Tensor   # [] label weights of the positions with a teacher
    blocks: torch.Tensor         # [] real blocks
    tau: torch.Tensor            # [] teacher-forced acceptance length with the selector walk, summed over blocks
    tau_base: torch.Tensor       # [] the same with per-position argmax
    count: torch.Tensor          # [T] supervised labels per position
    top1: torch.Tensor           # [T] argmax correct
    topk: torch.Tensor           # [T] true token among the top K
    selector_ok: torch.Tensor    # [T] selector's choice correct (given the true predecessor)

    @classmethod
    def zeros(cls, positions: int, device: torch.device | str = "cpu") -> "LossStats":
        """The neutral element of `+` for blocks of `positions` + 1 tokens."""
        return cls(**{f.name: torch.zeros(positions if f.name in _PER_POSITION else (), dtype=torch.float64,
                                          device=device) for f in fields(cls)})

    def _tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    def __add__(self, other: "LossStats") -> "LossStats":
        return LossStats(*(a.double() + b.double() for a, b in zip(self._tensors(), other._tensors())))

    def reduced(self, dist: "Dist") -> "LossStats":
        """The sum over all ranks (on the CPU): one all_reduce of every field packed in one vector."""
        parts = self._tensors()
        flat = torch.cat([t.double().reshape(-1) for t in parts]).to(dist.device)        # [9 + 4T]
        flat = dist.all_reduce_sum(flat).cpu()
        pieces = flat.split([t.numel() for t in parts])
        return LossStats(*(piece.reshape(t.shape) for piece, t in zip(pieces, parts)))

    def summary(self, selector_weight: float, has_selector: bool) -> dict:
        """The logged metrics (plain floats and lists; metrics.jsonl keys)."""
        weight = max(float(self.weight), 1e-12)
        blocks = max(float(self.blocks), 1.0)
        count = self.count.clamp(min=1.0)
        ce = float(self.ce) / weight
        sel = float(self.selector) / weight
        out = {
            "loss": ce + (selector_weight * sel if has_selector else 0.0),
            "loss_ce": ce,
            "tau_base": float(self.tau_base) / blocks,
            "top1": _rounded(self.top1 / count),
            "topk": _rounded(self.topk / count),
            "blocks": int(self.blocks),
        }
        if float(self.weight_alpha) > 0:
            out["acceptance_alpha"] = float(self.alpha) / float(self.weight_alpha)
        if has_selector:
            out["loss_selector"] = sel
            out["loss_selector_in_topk"] = float(self.selector) / max(float(self.weight_topk), 1e-12)
            out["tau"] = float(self.tau) / blocks
            out["selector_acc"] = _rounded(self.selector_ok / count)
        else:
            out["tau"] = out["tau_base"]
        return out


_PER_POSITION = ("count", "top1", "topk", "selector_ok")


def _rounded(values: torch.Tensor) -> list[float]:
    return [round(float(x), 5) for x in values]


def _selector_ce(draft, hidden, labels, predecessors, cand, cand_ids, selector_grad_to_backbone: bool,
                 gold: bool = False):
    """Selector CE over the top-K candidates: hidden [P, H], labels / predecessors [P] (target ids),
    cand [P, K] (rows of the draft's head, best first) and cand_ids [P, K] (their target ids)
    -> (sel_ce [P], sel_ok [P] bool). Where the label is not a candidate: sel_ce is 0, or with
    `gold` the CE over the candidates with the label in place of the K-th (for labels the head can
    draft); sel_ok is False (the real candidates only)."""
    hit = cand_ids == labels[:, None]                                        # [P, K]
    in_topk = hit.any(dim=-1)
    scored = in_topk
    if gold:
        draft_label = draft.target_to_draft(labels)
        swap = ~in_topk & (draft_label >= 0)                                 # [P] the K-th gives way
        cand = cand.clone()
        cand[swap, -1] = draft_label[swap]
        cand_ids = draft.draft_to_target(cand)
        hit = cand_ids == labels[:, None]
        scored = in_topk | swap
    target = hit.float().argmax(dim=-1)                                      # index of the label
    c = draft.config
    cand_logits = candidate_logits(hidden, draft.head_weight, cand, c.output_multiplier,
                                   c.final_logit_softcapping)                # [P, K]
    if not selector_grad_to_backbone:
        hidden, cand_logits = hidden.detach(), cand_logits.detach()
    scores = draft.selector.scores_given_predecessors(hidden, predecessors[:, None], cand_ids, cand_logits)[:, 0]
    sel_ce = F.cross_entropy(scores.float(), target, reduction="none") * scored
    sel_ok = (scores.argmax(dim=-1) == target) & in_topk
    return sel_ce, sel_ok


def _leading_correct(correct: torch.Tensor) -> torch.Tensor:
    """correct [..., T] bool -> number of leading True [...] (float)."""
    return correct.float().cumprod(dim=-1).sum(dim=-1)


@dataclass
class BlockOutcome:
    """How the acceptance path fared on each block of a batch (detached): accepted [b, N] long,
    the leading positions it got right; near_miss [b, N] bool, it failed at a supervised label of
    a real block that was among the draft's top-K candidates there."""
    accepted: torch.Tensor
    near_miss: torch.Tensor


def block_outcome(path_ok: torch.Tensor, in_topk: torch.Tensor, label_mask: torch.Tensor,
                  valid: torch.Tensor) -> BlockOutcome:
    """path_ok / in_topk / label_mask [b, N, T] bool, valid [b, N] bool -> `BlockOutcome`."""
    accepted = _leading_correct(path_ok).long()                               # [b, N]
    failed = accepted < path_ok.shape[-1]
    miss = accepted.clamp(max=path_ok.shape[-1] - 1)[:, :, None]              # [b, N, 1] first wrong position
    near = in_topk.gather(-1, miss)[..., 0] & label_mask.gather(-1, miss)[..., 0]
    return BlockOutcome(accepted=accepted, near_miss=near & failed & valid)


def block_losses(draft, hidden: torch.Tensor, batch: Batch, weights: torch.Tensor, normaliser: float,
                 *, selector_weight: float = 1.0, selector_grad_to_backbone: bool = False,
                 top_k: int = 16, chunk: int = 256, teacher: "Teacher | None" = None,
                 distill_weight: float = 0.0, options: "LossOptions | None" = None,
                 with_outcome: bool = False) -> tuple:
    """hidden [b, N, B, H] -> (scalar loss, detached stats[, BlockOutcome with `with_outcome`]).
    See the module docstring."""
    options = options or LossOptions()
    b, n, block, h = hidden.shape
    t = block - 1
    device = hidden.device
    w = label_weights(batch, weights)                                        # [b, N, T]
    predecessors = torch.cat([batch.block_ids[:, :, :1], batch.labels[:, :, :-1]], dim=-1)  # [b, N, T]
    flat_mask = batch.label_mask.reshape(-1)                                 # [b*N*T]
    index = torch.nonzero(flat_mask, as_tuple=False).flatten()               # [P]
    real = index.numel() > 0
    if not real:  # keep every parameter in the graph (DDP) with one zero-weight position
        index = torch.zeros(1, dtype=torch.long, device=device)
    hid = hidden[:, :, 1:].reshape(-1, h).index_select(0, index)             # [P, H]
    lab = batch.labels.reshape(-1)[index]
    prv = predecessors.reshape(-1)[index]
    wt = w.reshape(-1)[index] if real else torch.zeros(1, device=device)
    if selector_weight == 0 or draft.selector is None:
        selector_weight = 0.0
    if draft.selector is not None:
        top_k = draft.selector.top_k

    c = draft.config
    soft_ids = soft_probs = None
    if teacher is not None:
        soft_ids = draft.target_to_draft(teacher.ids.reshape(-1, teacher.ids.shape[-1])[index])          # [P, k]
        soft_probs = torch.softmax(teacher.logits.reshape(-1, teacher.logits.shape[-1])[index].float(), -1)
    require(options.acceptance_weight == 0 or teacher is not None,
            "loss.acceptance_weight > 0 needs the target's top-k distribution (loss.distill_top_k > 0)")
    loss_rows, ce, top1, cand, alpha = head_cross_entropy(
        hid, draft.head_weight, draft.target_to_draft(lab), top_k=top_k, chunk=chunk, multiplier=c.output_multiplier,
        softcap=c.final_logit_softcapping, soft_ids=soft_ids, soft_probs=soft_probs, hard_weight=1.0 - distill_weight,
        acceptance_weight=options.acceptance_weight)
    cand_ids = draft.draft_to_target(cand)                                   # [P, K] target ids
    in_topk = (cand_ids == lab[:, None]).any(dim=-1)
    if draft.selector is not None:
        sel_ce, sel_ok = _selector_ce(draft, hid, lab, prv, cand, cand_ids, selector_grad_to_backbone,
                                      gold=options.selector_gold)
    else:
        sel_ce, sel_ok = torch.zeros_like(ce), top1
    token_w = wt
    if options.position_weighting == "dpace":
        draftable = draft.target_to_draft(lab) >= 0
        confidence = torch.zeros(b * n * t, device=device)
        if real:
            confidence[index] = torch.exp(-ce.detach().float()) * draftable
        dense = dpace_weights(confidence.view(b, n, t), batch.label_mask, options.dpace_alpha)   # [b, N, T]
        token_w = dense.reshape(-1)[index] if real else wt
    sel_w = token_w if options.selector_weighting == "backbone" else wt
    ce_sum = (wt * ce).sum()
    objective_sum = (token_w * loss_rows).sum()
    sel_sum = (wt * sel_ce * in_topk).sum()
    topk_weight = (wt * in_topk).sum().detach()
    parts = {"top1": top1, "topk": in_topk, "selector_ok": sel_ok}
    loss = (objective_sum + selector_weight * (sel_w * sel_ce).sum()) / normaliser

    # ---- detached statistics (sums) -------------------------------------------------------
    with torch.no_grad():
        def scatter(name: str) -> torch.Tensor:                              # -> [b, N, T] bool
            dense = torch.zeros(b * n * t, dtype=torch.bool, device=device)
            if real:
                dense[index] = parts[name]
            return dense.view(b, n, t)

        top1, topk, sel_ok = scatter("top1"), scatter("topk"), scatter("selector_ok")
        outcome = block_outcome(sel_ok, topk, batch.label_mask, batch.block_valid) if with_outcome else None
        valid, counted = batch.block_valid, batch.label_mask                  # [b, N], [b, N, T]
        if batch.replayed is not None:   # acceptance statistics of the uniformly drawn blocks only
            valid = valid & ~batch.replayed
            counted = counted & valid[:, :, None]
            top1, topk, sel_ok = top1 & counted, topk & counted, sel_ok & counted
        stats = LossStats(
            weight=w.sum(),
            weight_topk=topk_weight,
            ce=ce_sum.detach(),
            selector=sel_sum.detach(),
            alpha=(wt * alpha).sum(),
            weight_alpha=wt.sum() if teacher is not None else torch.zeros((), device=device),
            blocks=valid.float().sum(),
            tau=((1 + _leading_correct(sel_ok)) * valid).sum(),
            tau_base=((1 + _leading_correct(top1)) * valid).sum(),
            count=counted.float().sum(dim=(0, 1)),                            # [T]
            top1=top1.float().sum(dim=(0, 1)),
            topk=topk.float().sum(dim=(0, 1)),
            selector_ok=sel_ok.float().sum(dim=(0, 1)),
        )
    return (loss, stats, outcome) if with_outcome else (loss, stats)
