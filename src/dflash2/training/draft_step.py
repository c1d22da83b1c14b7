"""Building the draft to train, and the one-forward training module that DDP / FSDP wrap.

Contract:
- `checked_shape(cfg, target_config, tokenizer)` -> (the `draft` section's `DraftShape`, mask
  token), checked against the target with errors naming the config key; `draft_config(...)` is the
  `DFlash2Config` they give (`DFlash2Config.for_target`: attention shape and MLP width default to
  the target's).
- Without `draft.mask_token_id`, the mask token is `targets.chat.choose_mask_token` (the same rule
  as `dflash2 init-draft`).
- `build_draft(cfg, target_model, tokenizer)`: a fresh draft from the draft factory
  (`model.factory.create_draft`, seeded by `train.seed`, final norm at `draft.final_norm_init`),
  optionally warm-started from the target (`warm_start_from_target`), or loaded from
  `draft.init_from`; in fp32, bound to the target's frozen embedding table and LM head (buffers
  that move with the draft). Returns (draft, report dict).
- `warm_start_from_target(draft, target_model)` copies, for draft layer i, the weights of target
  decoder layer L - n + i (the target's last n layers, the ones that turn features into next-token
  predictions): q/k/v/o projections, gate/up/down projections and, for Llama / Qwen-style
  targets, the RMSNorm weights including the final norm (Gemma's norms store weight - 1 and are
  skipped). A tensor is copied only where its shape matches. Returns the names copied.
- `training_module(cfg, draft, target_model)`: the training module of the configured family.
- `DraftTrainStep(draft, ...)` is an nn.Module whose forward(features, batch, normaliser) runs
  context K/V, all blocks and the loss in ONE call, so DistributedDataParallel / fully_shard see a
  single forward per micro-batch. Returns (loss, stats, outcome) as `losses.block_losses` with
  `with_outcome=True`.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from dflash2.data.vocab import coverage, frequency_vocabulary
from dflash2.targets.chat import choose_mask_token, stop_token_ids
from dflash2.model.config import DFlash2Config
from dflash2.model.draft import DFlash2DraftModel
from dflash2.model.factory import create_draft
from dflash2.model.shape import DraftShape, target_text_config
from dflash2.errors import require
from dflash2.decoding.verifier.adapter import decoder_layers
from dflash2.training.batches import Batch
from dflash2.training.config import TrainConfig
from dflash2.training.losses import LossOptions, Teacher, block_losses
from dflash2.training.mtp_step import MtpTrainStep, build_mtp_head, resolved_target_dir
from dflash2.training.weighting import position_weights


def checked_shape(cfg: TrainConfig, target_config, tokenizer=None) -> tuple[DraftShape, int]:
    """The `draft` section's shape and mask token, checked against the target (errors name the key)."""
    d = cfg.draft
    text = target_text_config(target_config)
    mask = d.mask_token_id if d.mask_token_id is not None else (
        choose_mask_token(tokenizer, text.vocab_size) if tokenizer is not None else text.vocab_size - 1)
    require(mask < text.vocab_size, f"config key 'draft.mask_token_id'={mask} is outside the target vocabulary "
                                    f"(vocab_size={text.vocab_size})")
    for layer in d.target_layer_ids or ():
        require(0 <= layer < text.num_hidden_layers,
                f"config key 'draft.target_layer_ids' has {layer}, outside the target's {text.num_hidden_layers} layers")
    shape = d.shape()
    attention = shape.attention(text)
    require(attention.num_attention_heads % attention.num_key_value_heads == 0,
            f"config key 'draft.num_key_value_heads'={attention.num_key_value_heads} must divide "
            f"draft.num_attention_heads={attention.num_attention_heads}")
    if d.use_conv:
        require(text.hidden_size % d.conv_group_size == 0,
                f"config key 'draft.conv_group_size'={d.conv_group_size} must divide the hidden size {text.hidden_size}")
    require(d.selector_top_k <= text.vocab_size,
            f"config key 'draft.selector_top_k'={d.selector_top_k} exceeds the vocabulary ({text.vocab_size})")
    return shape, mask


def draft_config(cfg: TrainConfig, target_config, tokenizer=None) -> DFlash2Config:
    shape, mask = checked_shape(cfg, target_config, tokenizer)
    return DFlash2Config.for_target(target_config, shape, mask_token_id=mask)


_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_NORMS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")


def warm_start_from_target(draft: DFlash2DraftModel, target_model) -> list[str]:
    layers = decoder_layers(target_model)
    model_type = getattr(target_text_config(target_model.config), "model_type", "")
    names = _LINEARS + (() if model_type.startswith("gemma") else _NORMS)
    first = len(layers) - len(draft.layers)
    require(first >= 0, "draft.warm_start_from_target: the draft has more layers than the target")
    copied = []
    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            source = layers[first + i]
            for name in names:
                dst, src = layer.get_submodule(name), None
                try:
                    src = source.get_submodule(name)
                except AttributeError:
                    continue
                if getattr(src, "weight", None) is not None and src.weight.shape == dst.weight.shape:
                    dst.weight.copy_(src.weight.to(dst.weight.dtype))
                    copied.append(f"layers.{i}.{name}.weight")
        final_norm = getattr(target_model.get_decoder(), "norm", None)
        if _NORMS[0] in names and getattr(final_norm, "weight", None) is not None \
                and final_norm.weight.shape == draft.norm.weight.shape:
            draft.norm.weight.copy_(final_norm.weight.to(draft.norm.weight.dtype))
            copied.append("norm.weight")
    return copied


def build_draft(cfg: TrainConfig, target_model, tokenizer=None, sequences=None) -> tuple[DFlash2DraftModel, dict]:
    """A fresh (or `init_from`) draft bound to the target; a fresh reduced-vocabulary draft takes
    the `draft.draft_vocab_size` most frequent response tokens of `sequences` (and the stop tokens).
    `draft.family: mtp`: an MTP head (`mtp_step.build_mtp_head`)."""
    if cfg.draft.family == "mtp":
        return build_mtp_head(cfg, target_model, tokenizer, resolved_target_dir(cfg.target.name))
    report: dict = {}
    choose_vocabulary = cfg.draft.draft_vocab_size is not None
    if cfg.draft.init_from:
        draft = DFlash2DraftModel.from_pretrained(cfg.draft.init_from).train()
        draft.config.validate_against_target(target_model.config)
        report["init_from"] = cfg.draft.init_from
        if cfg.draft.draft_vocab_size != draft.config.draft_vocab_size:  # the same draft, another vocabulary
            draft = with_vocabulary(draft, cfg.draft.draft_vocab_size)
        else:
            choose_vocabulary = False  # keep the checkpoint's own vocabulary
    else:
        shape, mask = checked_shape(cfg, target_model.config, tokenizer)
        draft = create_draft(target_model.config, shape, mask_token_id=mask, seed=cfg.train.seed,
                             final_norm_init=cfg.draft.final_norm_init)
        if cfg.draft.warm_start_from_target:
            report["warm_started"] = warm_start_from_target(draft, target_model)
    if choose_vocabulary:
        require(bool(sequences), "draft.draft_vocab_size needs training data to rank the tokens by frequency")
        stops = stop_token_ids(tokenizer, target_model.config) if tokenizer is not None else ()
        ids = frequency_vocabulary(sequences, draft.config.draft_vocab_size, draft.config.vocab_size, stops)
        draft.set_draft_vocabulary(ids)
        report["draft_vocab_coverage"] = coverage(sequences, ids, draft.config.vocab_size)
    draft = draft.float().train()
    draft.bind_target(target_model.get_input_embeddings().weight, target_model.get_output_embeddings().weight)
    report["parameters"] = draft.num_parameters()
    return draft, report


def with_vocabulary(draft: DFlash2DraftModel, draft_vocab_size: int | None) -> DFlash2DraftModel:
    """The same weights in a draft whose output vocabulary has `draft_vocab_size` tokens (None: the
    target's); the vocabulary itself is chosen by the caller (`set_draft_vocabulary`)."""
    config = dataclasses.replace(draft.config, draft_vocab_size=draft_vocab_size)
    other = DFlash2DraftModel(config)
    state = {k: v for k, v in draft.state_dict().items() if k not in ("d2t", "t2d")}
    missing, unexpected = other.load_state_dict(state, strict=False)
    require(not unexpected and set(missing) <= {"d2t", "t2d"}, f"cannot change the vocabulary of this draft: {missing or unexpected}")
    return other.train()


class DraftTrainStep(nn.Module):
    """Context K/V + all blocks + loss of one micro-batch in one forward call."""

    def __init__(self, draft: DFlash2DraftModel, gamma: float, selector_weight: float,
                 selector_grad_to_backbone: bool, logits_chunk: int, distill_weight: float = 0.0,
                 options: LossOptions | None = None):
        super().__init__()
        self.distill_weight = distill_weight
        self.options = options or LossOptions()
        self.draft = draft
        self.register_buffer("weights", position_weights(draft.config.block_size, gamma), persistent=False)
        self.selector_weight = selector_weight
        self.selector_grad_to_backbone = selector_grad_to_backbone
        self.logits_chunk = logits_chunk

    def forward(self, features: torch.Tensor, batch: Batch, normaliser: float, teacher: Teacher | None = None):
        """features [b, L, F]; batch (and teacher) on the same device -> (loss, stats, outcome)."""
        draft = self.draft
        context = draft.context_kv(features, batch.positions)                     # per layer [b, kv, L, d]
        hidden = draft.forward_blocks(batch.block_ids, batch.block_positions, context, batch.attn_mask)  # [b, N, B, H]
        return block_losses(draft, hidden, batch, self.weights, normaliser,
                            selector_weight=self.selector_weight,
                            selector_grad_to_backbone=self.selector_grad_to_backbone,
                            chunk=self.logits_chunk, teacher=teacher, distill_weight=self.distill_weight,
                            options=self.options, with_outcome=True)


def training_module(cfg: TrainConfig, draft, target_model) -> nn.Module:
    """The one-forward training module of `draft`: `DraftTrainStep`, or `MtpTrainStep` for an MTP head."""
    loss = cfg.loss
    options = LossOptions.from_section(loss)
    if cfg.draft.family == "mtp":
        from dflash2.model.mtp import target_final_norm

        return MtpTrainStep(draft, target_final_norm(target_model), cfg.resolved_gamma(), loss.logits_chunk,
                            loss.distill_weight, options)
    return DraftTrainStep(draft, cfg.resolved_gamma(), loss.selector_weight, loss.selector_grad_to_backbone,
                          loss.logits_chunk, loss.distill_weight, options)


def clip_groups(module: nn.Module, separate_selector: bool) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters grouped for gradient-norm clipping: {"grad_norm": backbone (+ selector)
    [, "grad_norm_selector": selector]}.

    With `separate_selector` the selector is clipped on its own. Its loss reads detached hidden
    states and logits (`loss.selector_grad_to_backbone=false`), so it and the backbone are separate
    problems; one shared norm would still couple them through the clip factor, and a draft with a
    selector would not train its backbone exactly as the same draft without one. Separated, the
    DFlash v1 / v1 + selector arms of the ablation are a paired comparison (tested bit-identical).
    """
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    selector = [p for name, p in named if "candidate_selector." in name] if separate_selector else []
    chosen = {id(p) for p in selector}
    groups = {"grad_norm": [p for _, p in named if id(p) not in chosen]}
    if selector:
        groups["grad_norm_selector"] = selector
    return groups
