"""The DFlash / DFlash2 block-diffusion draft model (docs/spec.md §2).

Contract:
- `DFlash2DraftModel(config)` owns exactly the tensors of docs/spec.md §2.2 (names and shapes are
  the checkpoint format shared with the published checkpoints and the engines). It has no embedding
  table and no LM head: `bind_target(embed_weight, lm_head_weight)` borrows the target's (frozen)
  as the non-persistent buffers `embed_weight` / `lm_head_weight`, cast to the draft's dtype where
  they lie (the target's device); where that is the target's dtype they share its storage (no
  copy), and a tied target's single matrix stays one tensor. Moving or casting the draft
  (`.to()`, `.float()`, ...) moves them with it, sharing the target's storage again wherever the
  new dtype and device are the target's. They are never in `state_dict()`, so never saved.
- `context_kv(features, positions)` turns tapped target hidden states [b, L, n_taps*H_t] into
  per-layer (K, V) of the context; the context is never updated by draft layers, so callers cache it.
- `forward_blocks(block_ids, block_positions, context_kv, mask)` runs blocks `[anchor, MASK, ...]`
  laid out [b, n_blocks, B]: queries are block tokens only, keys/values are `[context ; blocks]`,
  `mask` [b, 1, n*B, L + n*B] (True = visible) encodes window / causality / block sparsity.
  Returns hidden states after the final norm, [b, n, B, H].
- `logits(hidden)` applies the target LM head, `output_multiplier` and the optional softcap; a reduced
  draft vocabulary (`d2t` / `t2d`) scores its rows, sliced anew whenever it is set or loaded.
- `pack()` (the proposer calls it) keeps inference copies of the projections (`model.packing`:
  q/k/v and gate/up each one matmul, oneDNN-prepacked on the CPU at bfloat16 and float32) that
  passes without gradients use; parameters, `state_dict()`, training and export see the unpacked
  module; the `packing` switch off keeps every pass on the modules' own matmuls
  (tests/test_draft_pass.py compares the two).
- `save_pretrained` / `from_pretrained` read and write `config.json` + `model.safetensors`
  atomically (into an existing directory only those two files are replaced); DFlash v1
  checkpoints load as drafts without convs and selector. `from_pretrained` checks the weights
  files' headers before reading them and refuses NaN / inf tensors, each with one line naming
  the file or tensor; `read_config` refuses a missing, non-UTF-8 or non-object config.json.
  `write_checkpoint(path, state, config)` and `read_checked_weights(path, expected, what, ...)` are
  those two halves for any head of this checkpoint layout (the MTP head, `model.mtp_checkpoint`).
"""
from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from dflash2.model.config import DFlash2Config
from dflash2.model.conv import GroupedDynamicConv
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_directory, atomic_file, atomic_write
from dflash2.model.packing import project, project_joined, repack
from dflash2.model.selector import CandidateSelector
from dflash2.model.swiglu import SwiGLU
from dflash2.files.weights import require_finite, safetensors_header, save_safetensors
from dflash2.files.userjson import parse_json


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE)  # all that `save_pretrained` writes


class RMSNorm(nn.Module):
    """Qwen3-style RMSNorm, computed in fp32 (tapped features can have norms in the thousands). On
    the CPU without gradients, x in the weight's dtype goes to `F.rms_norm` as it is: the CPU's
    rms_norm computes in fp32 and rounds once to x's dtype, the same bits with three operations
    fewer (tests/test_draft_pass.py)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype and x.device.type == "cpu" and not torch.is_grad_enabled():
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(self.weight.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """positions [...] -> cos, signed sin [..., 1 (heads), head_dim] for rotate-half RoPE: the sin of
    the first half negated, so that `apply_rope` rotates by one roll. Made once per pass, shared by
    every layer's queries and keys."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = (positions.float().unsqueeze(-1) * inv_freq).unsqueeze(-2)          # [..., 1, d/2]
    sin = angles.sin()
    return torch.cat([angles, angles], dim=-1).cos().to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, d]; cos, signed sin from `rope_cos_sin`. rotate_half(x) * sin equals
    roll(x, d/2) * signed sin, element for element."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class DraftAttention(nn.Module):
    def __init__(self, config: DFlash2Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.packed_qkv = self.packed_kv = self.packed_o = None   # `DFlash2DraftModel.pack`

    def pack(self) -> None:
        self.packed_qkv = repack(self.packed_qkv, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
        self.packed_kv = repack(self.packed_kv, self.k_proj.weight, self.v_proj.weight)
        self.packed_o = repack(self.packed_o, self.o_proj.weight)

    def key_value(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """x [b, L, H], rope (cos, sin) of its positions [b, L, 1, d] -> roped K, V [b, kv_heads, L, d]."""
        return self._rope_kv(*project(x, self.packed_kv, self.k_proj.weight, self.v_proj.weight), rope)

    def _rope_kv(self, k: torch.Tensor, v: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [b, L, kv_heads * d] -> normed, roped K and V [b, kv_heads, L, d]."""
        b, length, _ = k.shape
        k = k.view(b, length, self.kv_heads, self.head_dim)
        v = v.view(b, length, self.kv_heads, self.head_dim)
        return apply_rope(self.k_norm(k), *rope).transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], context: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor) -> torch.Tensor:
        """x [b, Q, H] block tokens, rope (cos, sin) of their positions [b, Q, 1, d]; context K/V
        [b, kv, L, d]; mask [b, 1, Q, L+Q]."""
        b, q_len, _ = x.shape
        q, k_block, v_block = self.block_qkv(x, rope)
        k = torch.cat([context[0], k_block], dim=2)
        v = torch.cat([context[1], v_block], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return project(out.transpose(1, 2).reshape(b, q_len, self.heads * self.head_dim), self.packed_o, self.o_proj.weight)[0]

    def block_qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [b, Q, H] -> normed, roped q [b, heads, Q, d] and the block's own K, V [b, kv_heads, Q, d]."""
        b, q_len, _ = x.shape
        weights = (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
        whole = project_joined(x, self.packed_qkv, *weights)                 # [b, Q, (heads + 2 kv) d] or None
        if whole is not None and self.q_norm.eps == self.k_norm.eps:
            return self._joint_qkv(whole.view(b, q_len, -1, self.head_dim), rope)
        q, k, v = project(x, self.packed_qkv, *weights)
        k, v = self._rope_kv(k, v, rope)
        q = q.view(b, q_len, self.heads, self.head_dim)
        return apply_rope(self.q_norm(q), *rope).transpose(1, 2), k, v

    def _joint_qkv(self, qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [b, Q, heads + 2 kv_heads, d], one packed projection's output -> what `block_qkv` returns,
        q and k heads normed and roped together: RMSNorm's fp32 steps (normalise, times the weight,
        round once) on all of them at once, each head with its own norm's weight; the same bits."""
        rotated = self.heads + self.kv_heads
        weight = torch.cat([self.q_norm.weight.float().expand(self.heads, -1),
                            self.k_norm.weight.float().expand(self.kv_heads, -1)])          # [heads + kv, d]
        qk = (F.rms_norm(qkv[:, :, :rotated].float(), (self.head_dim,), None, self.q_norm.eps) * weight).to(qkv.dtype)
        qk = apply_rope(qk, *rope).transpose(1, 2)                                            # [b, heads + kv, Q, d]
        return qk[:, :self.heads], qk[:, self.heads:], qkv[:, :, rotated:].transpose(1, 2)


class DraftLayer(nn.Module):
    def __init__(self, config: DFlash2Config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(config)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.use_conv = config.use_conv
        if config.use_conv:
            self.attention_conv = GroupedDynamicConv(config.hidden_size, config.conv_kernel_size, config.conv_group_size)
            self.mlp_conv = GroupedDynamicConv(config.hidden_size, config.conv_kernel_size, config.conv_group_size)
        self.packed_gate_up = self.packed_down = None   # `DFlash2DraftModel.pack`

    def pack(self) -> None:
        self.self_attn.pack()
        mlp = self.mlp
        self.packed_gate_up = repack(self.packed_gate_up, mlp.gate_proj.weight, mlp.up_proj.weight)
        self.packed_down = repack(self.packed_down, mlp.down_proj.weight)
        if self.use_conv:
            self.attention_conv.pack()
            self.mlp_conv.pack()

    def swiglu(self, m: torch.Tensor) -> torch.Tensor:
        """`self.mlp(m)` (the same products), gate and up by one packed matmul where packed."""
        mlp = self.mlp
        gate, up = project(m, self.packed_gate_up, mlp.gate_proj.weight, mlp.up_proj.weight)
        return project(F.silu(gate) * up, self.packed_down, mlp.down_proj.weight)[0]

    def forward(self, x, rope, context, mask, conv_enabled: bool = True):
        """x [b, n, B, H] (block layout keeps the convolutions block-local); rope (cos, sin) of the
        positions [b, n*B, 1, d]."""
        b, n, block, h = x.shape
        flat = (b, n * block, h)
        use_conv = self.use_conv and conv_enabled
        a = self.input_layernorm(x)
        if use_conv:
            a, k1 = self.attention_conv.prepare(a)
        y = self.self_attn(a.reshape(flat), rope, context, mask).view_as(x)
        x = x + (self.attention_conv.finish(y, k1) if use_conv else y)
        m = self.post_attention_layernorm(x)
        if use_conv:
            m, k2 = self.mlp_conv.prepare(m)
        y = self.swiglu(m)
        return x + (self.mlp_conv.finish(y, k2) if use_conv else y)


class DFlash2DraftModel(nn.Module):
    def __init__(self, config: DFlash2Config):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(config.num_taps * config.target_hidden_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        if config.use_selector:
            self.candidate_selector = CandidateSelector(config.vocab_size, h, config.selector_rank, config.selector_top_k)
        self.register_buffer("embed_weight", None, persistent=False)      # [V, H], bound by bind_target
        self.register_buffer("lm_head_weight", None, persistent=False)   # [V, H]
        if config.draft_vocab_size is not None:
            # EAGLE-3 layout: draft id i is target id i + d2t[i]; t2d marks the target ids kept.
            # Identity until `set_draft_vocabulary` (training) or a checkpoint fills them.
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            kept = torch.zeros(config.vocab_size, dtype=torch.bool)   # (no comparison op: it would import torch._dynamo)
            kept[:config.draft_vocab_size] = True
            self.register_buffer("t2d", kept)
        self.register_buffer("draft_head", None, persistent=False)       # [Vd, H] rows of lm_head_weight
        self.register_load_state_dict_post_hook(DFlash2DraftModel._slice_head)   # a loaded vocabulary
        self._borrowed: _Borrowed | None = None
        self.packed_fc = self.packed_head = None   # `pack`
        self.packing = True       # analysis switch: False keeps every pass on the modules' own matmuls
        self.conv_enabled = True  # analysis switch: run a DFlash2 draft with its convolutions off

    def pack(self) -> None:
        """Keep inference copies of the projections (`model.packing`): q/k/v and gate/up each as one
        matmul, on oneDNN's prepacked layout on the CPU. Passes without gradients use them (a
        weight changed in place is copied again before its next use; a weight replaced by another
        tensor, as `bind_target` replaces the head, runs on the module's own matmul until the next
        `pack`); the parameters, `state_dict()` and training are untouched. With `packing` off it
        drops every pack."""
        if not self.packing:
            for module in self.modules():
                for name in [n for n in vars(module) if n.startswith("packed_")]:
                    setattr(module, name, None)
            return
        for layer in self.layers:
            layer.pack()
        self.packed_fc = repack(self.packed_fc, self.fc.weight)
        head = self.head_weight
        self.packed_head = None if head is None else repack(self.packed_head, head)
        if self.selector is not None:
            self.selector.pack()

    @property
    def selector(self) -> CandidateSelector | None:
        return self.candidate_selector if self.config.use_selector else None

    def bind_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Borrow the target's (frozen) embedding table and LM head; they are never saved."""
        require(embed_weight.shape == (self.config.vocab_size, self.config.hidden_size),
                f"draft/target mismatch: target embedding is {tuple(embed_weight.shape)}, draft expects "
                f"({self.config.vocab_size}, {self.config.hidden_size})")
        # Kept in the draft's own dtype: a bf16 draft next to an fp32 target reads half the bytes
        # (the LM head dominates a draft pass) and cannot change the output, which the target decides.
        dtype = self.fc.weight.dtype
        self._borrowed = _Borrowed(embed_weight.detach(), lm_head_weight.detach(), lm_head_weight is embed_weight)
        embed = embed_weight.detach().to(dtype)
        self.embed_weight = embed
        self.lm_head_weight = embed if self._borrowed.tied else lm_head_weight.detach().to(dtype)
        self._slice_head()

    # ------------------------------------------------------------------ draft vocabulary
    @property
    def reduced_vocabulary(self) -> bool:
        return self.config.draft_vocab_size is not None

    def draft_token_ids(self) -> torch.Tensor:
        """[Vd] the target ids of the draft vocabulary, ascending (all ids when not reduced)."""
        if not self.reduced_vocabulary:
            return torch.arange(self.config.vocab_size, device=self.fc.weight.device)
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocabulary(self, target_ids: torch.Tensor) -> None:
        """Choose the draft vocabulary: `config.draft_vocab_size` distinct target ids."""
        ids = torch.unique(torch.as_tensor(target_ids, dtype=torch.long))            # sorted
        require(self.reduced_vocabulary and ids.numel() == self.config.draft_vocab_size,
                f"a draft vocabulary of {self.config.draft_vocab_size} ids is needed, got {ids.numel()}")
        require(int(ids[0]) >= 0 and int(ids[-1]) < self.config.vocab_size, "draft vocabulary ids outside the target's")
        self.d2t.copy_(ids.to(self.d2t.device) - torch.arange(ids.numel(), device=self.d2t.device))
        self.t2d.zero_()
        self.t2d[ids.to(self.t2d.device)] = True
        self._slice_head()

    def target_to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 for ids outside the draft vocabulary (identity when full)."""
        if not self.reduced_vocabulary:
            return ids
        index = self.t2d.long().cumsum(0) - 1                                         # [V]
        return torch.where(self.t2d[ids], index[ids], torch.full_like(ids, -1))

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft ids (positions in the LM-head output) -> target ids."""
        return ids + self.d2t[ids] if self.reduced_vocabulary else ids

    def _slice_head(self, incompatible_keys=None) -> None:   # (a load_state_dict post hook too)
        if self.reduced_vocabulary and self.lm_head_weight is not None:
            self.draft_head = self.lm_head_weight[self.draft_token_ids().to(self.lm_head_weight.device)]

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head rows the draft scores: [Vd, H] (reduced vocabulary) or the target's [V, H]."""
        return self.draft_head if self.reduced_vocabulary else self.lm_head_weight

    def _apply(self, fn, recurse: bool = True):
        """nn.Module's move / cast of every tensor, then the borrowed buffers point at the target's
        own tensors again where dtype and device allow it (and a tied head at the embedding)."""
        super()._apply(fn, recurse)
        if self._borrowed is not None:
            self._borrowed.share_into(self._buffers)
        return self

    # ------------------------------------------------------------------ forward pieces
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        require(self.embed_weight is not None, "draft is not bound to a target: call bind_target first")
        x = F.embedding(ids, self.embed_weight).to(self.fc.weight.dtype)
        return x * self.config.input_embedding_scale if self.config.input_embedding_scale != 1.0 else x

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """features [b, L, n_taps*H_t], positions [b, L] -> per layer (K, V) [b, kv, L, d]."""
        ctx = self.hidden_norm(project(features.to(self.fc.weight.dtype), self.packed_fc, self.fc.weight)[0])
        rope = self.rope(positions, ctx.dtype)
        return [layer.self_attn.key_value(ctx, rope) for layer in self.layers]

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [b, L] -> (cos, signed sin) [b, L, 1, head_dim], shared by every layer."""
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def forward_blocks(self, block_ids: torch.Tensor, block_positions: torch.Tensor,
                       context: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> torch.Tensor:
        """block_ids / block_positions [b, n, B] -> final-norm hidden [b, n, B, H]."""
        x = self.embed(block_ids)
        rope = self.rope(block_positions.reshape(block_positions.shape[0], -1), x.dtype)
        for layer, layer_context in zip(self.layers, context):
            x = layer(x, rope, layer_context, mask, self.conv_enabled)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., Vd] over the draft vocabulary (the target's whole vocabulary
        unless reduced; map ids with `draft_to_target`)."""
        # 2-D input: F.linear on [..., T, H] with a broadcast weight falls into a much slower
        # batched matmul on CPU (docs/cycle-cost.md, components on a CPU).
        flat = hidden.reshape(-1, hidden.shape[-1])
        logits = project(flat, self.packed_head, self.head_weight.to(hidden.dtype))[0].float().view(*hidden.shape[:-1], -1)
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(self, path: str | Path) -> None:
        """Write `config.json` and `model.safetensors` (`write_checkpoint`)."""
        write_checkpoint(path, self.state_dict(), self.config.to_dict())

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> "DFlash2DraftModel":
        """Load a checkpoint, refusing (one line, naming the file or tensor) a bad config, an empty,
        truncated or foreign weights file, tensors of the wrong names or shapes, and NaN / inf."""
        path = Path(path)
        config = read_config(path)
        with torch.device("meta"):
            model = cls(config)
        expected = model.state_dict()
        state = read_checked_weights(path, {n: t.shape for n, t in expected.items()}, f"draft '{path}'",
                                     prefix="model.", ignored=("embed_tokens", "lm_head"))
        model.load_state_dict({n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()},
                              assign=True)
        return model.to(device).eval()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


@dataclass(frozen=True, eq=False)
class _Borrowed:
    """The target's own embedding and LM head tensors behind a draft's borrowed buffers."""

    embed: torch.Tensor      # [V, H]
    head: torch.Tensor       # [V, H]
    tied: bool               # the target's LM head is its embedding

    def share_into(self, buffers: dict) -> None:
        """Replace the buffers by the target's tensors where dtype and device match (no copies)."""
        for name, source in (("embed_weight", self.embed), ("lm_head_weight", self.head)):
            current = buffers[name]
            if current is not None and (current.dtype, current.device) == (source.dtype, source.device):
                buffers[name] = source
        if self.tied:
            buffers["lm_head_weight"] = buffers["embed_weight"]


def read_config(path: str | Path) -> DFlash2Config:
    """Read and validate a checkpoint's config.json (one-line errors)."""
    require(Path(path).is_dir(), f"draft '{path}' is not a directory with config.json and weights")
    file = Path(path) / CONFIG_FILE
    require(file.is_file(), f"draft checkpoint '{path}' has no config.json")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DFlash2Error(f"draft config '{file}' is not UTF-8 text") from None
    raw = parse_json(text, f"draft config '{file}'")
    require(isinstance(raw, dict), f"draft config '{file}' must hold a JSON object, not {type(raw).__name__}")
    try:
        return DFlash2Config.from_dict(raw)
    except DFlash2Error as err:
        raise DFlash2Error(f"draft config '{file}': {err}") from None


def write_checkpoint(path: str | Path, state: dict[str, torch.Tensor], config: dict) -> None:
    """Write `config.json` and `model.safetensors`: a new directory appears whole; into an existing one
    (the caller checked that the user allows it) only these two files are replaced, each atomically,
    and nothing else there is touched."""
    path = Path(path)
    if path.is_dir():
        _write_checkpoint_files(path, state, config)
        return
    with atomic_directory(path) as tmp:
        _write_checkpoint_files(tmp, state, config)


def _write_checkpoint_files(directory: Path, state: dict[str, torch.Tensor], config: dict) -> None:
    with atomic_file(directory / WEIGHTS_FILE) as tmp:
        save_safetensors({name: t.detach().contiguous() for name, t in state.items()}, tmp)
    with atomic_write(directory / CONFIG_FILE, "w") as handle:
        handle.write(json.dumps(config, indent=2) + "\n")


def read_checked_weights(path: str | Path, expected: dict[str, tuple[int, ...]], what: str, prefix: str = "",
                         ignored: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The tensors `expected` (name -> shape) of a checkpoint directory's safetensors files, names
    stripped of `prefix`; refused in one line naming the file or tensor: no weights files, an empty,
    truncated or foreign file, a missing tensor, one of another shape, an unexpected one (names
    starting with `ignored` excepted), NaN / inf values."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    require(bool(files), f"{what} has no .safetensors weights")
    headers = {}
    for file in files:
        for name, (_dtype, shape) in safetensors_header(file, what).items():
            headers[name.removeprefix(prefix)] = shape
    missing = [n for n in expected if n not in headers]
    require(not missing, f"{what} is missing tensor '{missing[0]}'" if missing else "")
    for name, shape in expected.items():
        require(tuple(headers[name]) == tuple(shape),
                f"{what}: tensor '{name}' has shape {tuple(headers[name])}, config implies {tuple(shape)}")
    unexpected = [n for n in headers if n not in expected and not n.startswith(ignored or ("\0",))]
    require(not unexpected, f"{what} has unexpected tensor '{unexpected[0]}'" if unexpected else "")
    state = {}
    for file in files:
        try:
            loaded = load_file(str(file))
        except (SafetensorError, OSError) as err:
            raise DFlash2Error(f"{what}: weights file '{file}' cannot be read: {str(err).splitlines()[0]}") from None
        for name, tensor in loaded.items():
            if name.removeprefix(prefix) in expected:
                state[name.removeprefix(prefix)] = tensor
    for name in expected:
        require_finite(name, state[name], what)
    return state


def init_linear_weights(model: DFlash2DraftModel, std: float = 0.02, seed: int | None = None) -> None:
    """Fresh-draft init: normal(0, std) linears, unit norms, identity convs, neutral selector.

    Each module draws from the global generator re-seeded with (seed, its name, pass), so a part's
    init does not depend on which other parts exist: DFlash v1, +selector, +convs and DFlash2 built
    with one seed share every common weight (the equal-budget ablation relies on it). `seed=None`
    takes one draw from the global generator as the base seed.
    """
    base = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed

    def reseed(name: str, stage: int) -> None:
        torch.manual_seed((base * 1_000_003 + zlib.crc32(f"{stage}:{name}".encode())) % (2**63 - 1))

    with torch.random.fork_rng(devices=[]):
        for name, module in model.named_modules():
            reseed(name, 0)
            if module is model.fc:  # maps concatenated taps: the fused context starts near unit variance
                nn.init.normal_(module.weight, std=1.0 / math.sqrt(module.in_features))
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for name, module in model.named_modules():  # after the linears: identity convs, neutral selector
            if isinstance(module, (GroupedDynamicConv, CandidateSelector)):
                reseed(name, 1)
                module.reset_parameters()
