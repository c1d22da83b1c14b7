"""Training an MTP head with the draft trainer: its recursion laid out as the trainer's blocks.

Contract:
- `build_mtp_head(cfg, target_model, tokenizer, target_dir)` -> (head, report): `draft.init_from`
  (an MTP head checkpoint), else a fresh head (`model.mtp.create_mtp_head`, seeded by
  `train.seed`, block `draft.block_size`) which `draft.warm_start_from_target` starts from the
  target's own MTP head where its checkpoint ships one (`mtp.*` tensors: fine-tuning that head)
  or else from the target's last full-attention layer and final norm. Bound to the target's
  embedding and LM head, fp32, training mode. `report["warm_started"]`: "target's MTP head", the
  tensor names copied, or absent.
- `MtpTrainStep(head, final_norm, gamma, logits_chunk, distill_weight, options)` is the trainer's
  one-forward module for an MTP head (`DraftTrainStep`'s counterpart; the head sits under `draft`,
  so checkpoints and DDP treat it alike). forward(features, batch, normaliser, teacher) ->
  (loss, stats, outcome) of `losses.block_losses` on `mtp_block_hidden`: a block anchored at a is the
  head's recursion at inference, step i (1..B-1) predicting the token at a + i, so the loss, the
  position weights and the teacher-forced tau are the DFlash draft's, measured alike.
- `mtp_block_hidden(head, hidden, batch)`: hidden = the target's final-norm states [b, L, H] ->
  the head's output for every block position [b, N, B, H] (position 0, the anchor, zeros). Step 1
  is one causal pass over every entry of the sequence (entry p: state at p - 1, token at p); step
  i > 1 of the block at a runs at position a + i - 1 on the head's own output of step i - 1 and the
  true token there (teacher forcing: a block continues only while the head was right), seeing the
  step-1 entries up to a and its own block's earlier steps: what the proposer's cache holds at
  that point. Gradients flow through the whole recursion. A block anchored at 0 has no entry
  (nothing precedes the first token) and no labels.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from dflash2.model.mtp import KVSplice, MtpHead, create_mtp_head, warm_start_from_target
from dflash2.model.mtp_checkpoint import head_from_target, load_mtp_head
from dflash2.training.batches import Batch
from dflash2.training.losses import LossOptions, Teacher, block_losses
from dflash2.training.weighting import position_weights


def build_mtp_head(cfg, target_model, tokenizer=None, target_dir: str | None = None) -> tuple[MtpHead, dict]:
    from dflash2.targets.chat import choose_mask_token
    from dflash2.model.shape import target_text_config

    d, report = cfg.draft, {}
    vocab = target_text_config(target_model.config).vocab_size
    mask = d.mask_token_id if d.mask_token_id is not None else (
        choose_mask_token(tokenizer, vocab) if tokenizer is not None else vocab - 1)
    if d.init_from:
        head = load_mtp_head(d.init_from)
        head.config.validate_against_target(target_model.config)
        report["init_from"] = d.init_from
    else:
        head = create_mtp_head(target_model.config, d.block_size, seed=cfg.train.seed, mask_token_id=mask)
        if d.warm_start_from_target:
            own = head_from_target(target_dir, target_model.config, d.block_size, mask) if target_dir else None
            if own is not None:
                head, report["warm_started"] = own, "target's MTP head"
            else:
                report["warm_started"] = warm_start_from_target(head, target_model)
    head.config = dataclasses.replace(head.config, block_size=d.block_size, mask_token_id=mask, origin="trained")
    head = head.float().train()
    head.bind_target(target_model.get_input_embeddings().weight, target_model.get_output_embeddings().weight)
    report["parameters"] = head.num_parameters()
    return head, report


def mtp_block_hidden(head: MtpHead, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    b, length = batch.input_ids.shape
    n, block = batch.anchors.shape[1], batch.block_positions.shape[2]
    device = hidden.device
    real = batch.attention_mask[:, 1:].bool()                                               # [b, L-1] entries 1..L-1
    entry_pos = torch.arange(1, length, device=device)                                      # [L-1]
    x = head.fuse(hidden[:, :-1], batch.input_ids[:, 1:])                                   # [b, L-1, H]
    causal = entry_pos[None, :] <= entry_pos[:, None]                                       # [L-1, L-1]
    mask = (causal[None] & real[:, None, :]) | torch.eye(length - 1, dtype=torch.bool, device=device)[None]
    splice = KVSplice()
    first = head.run_layer(x, entry_pos[None].expand(b, -1), splice, mask[:, None])         # [b, L-1, H]
    committed = splice.new                                                                  # K/V [b, kv, L-1, d]
    anchors = batch.anchors                                                                 # [b, N]
    entry = (anchors - 1).clamp(min=0)                                                      # entry index of the anchor
    out = [torch.zeros_like(first[:, :n]), first.gather(1, entry[:, :, None].expand(-1, -1, first.shape[-1]))]
    sees_committed = (entry_pos[None, None, :] <= anchors[:, :, None]) & real[:, None, :]  # [b, N, L-1]
    own_block = torch.eye(n, dtype=torch.bool, device=device)[None].expand(b, -1, -1)       # [b, N, N]
    speculative = None
    for i in range(2, block):
        tokens = batch.labels[:, :, i - 2]                                                  # the true token at a + i - 1
        x = head.fuse(out[-1], tokens)                                                      # [b, N, H]
        past = committed if speculative is None else tuple(torch.cat(p, dim=2) for p in zip(committed, speculative))
        mask = torch.cat([sees_committed] + [own_block] * (i - 1), dim=-1)                  # [b, N, L-1 + N*(i-1)]
        splice = KVSplice(past)
        out.append(head.run_layer(x, anchors + i - 1, splice, mask[:, None]))
        speculative = splice.new if speculative is None else tuple(
            torch.cat(p, dim=2) for p in zip(speculative, splice.new))
    return torch.stack(out, dim=2)                                                          # [b, N, B, H]


class MtpTrainStep(nn.Module):
    def __init__(self, head: MtpHead, final_norm: nn.Module, gamma: float, logits_chunk: int,
                 distill_weight: float = 0.0, options: LossOptions | None = None):
        super().__init__()
        self.draft = head
        self.__dict__["final_norm"] = final_norm       # the target's, frozen: not a parameter of this module
        self.register_buffer("weights", position_weights(head.config.block_size, gamma), persistent=False)
        self.logits_chunk, self.distill_weight = logits_chunk, distill_weight
        self.options = options or LossOptions()

    def forward(self, features: torch.Tensor, batch: Batch, normaliser: float, teacher: Teacher | None = None):
        with torch.no_grad():
            hidden = self.__dict__["final_norm"](features)
        hidden = mtp_block_hidden(self.draft, hidden, batch)
        has_entry = (batch.anchors >= 1)[:, :, None]                                        # a block at 0 has none
        batch = dataclasses.replace(batch, label_mask=batch.label_mask & has_entry,
                                    block_valid=batch.block_valid & has_entry[:, :, 0])
        return block_losses(self.draft, hidden, batch, self.weights, normaliser, selector_weight=0.0,
                            chunk=self.logits_chunk, teacher=teacher, distill_weight=self.distill_weight,
                            options=self.options, with_outcome=True)


def resolved_target_dir(name: str) -> str | None:
    """The user's local target directory, where its `mtp.*` may be (None for a built-in target, none
    of which ships a head, and for a hub id)."""
    from dflash2.targets.builtin import BUILTIN_TARGETS

    return name if name not in BUILTIN_TARGETS and Path(name).expanduser().is_dir() else None
