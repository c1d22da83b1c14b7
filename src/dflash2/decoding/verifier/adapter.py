"""Target adapter: a Hugging Face causal LM as the verifier of speculative decoding (docs/spec.md §3).

Contract:
- `TargetAdapter(model, target_layer_ids)` wraps Llama-, Qwen3-, Gemma3-style (and any other
  attention-only) HF causal LMs, and the hybrids of `recurrent.py` (Gated DeltaNet / short-conv layers
  beside full attention: Qwen3.5, Qwen3.5-MoE, Qwen3-Next, LFM2). Other recurrent layer kinds are
  refused with a `DFlash2Error`. The model comes as `targets` loads it (`targets.kernels.use_kernels`:
  folded grouped-query attention, the hybrids' capturing delta rule); the adapter patches nothing.
- The batch lives in one KV cache, left-padded: every row's tokens are contiguous and end at the
  right edge, so a sliding window in slot space equals the window in token positions. The adapter
  keeps the matching 2-D attention mask and each row's next position.
- `prefill(prompts)` starts a batch; `add_rows(prompts)` prefills more prompts and merges them
  into the running batch (both parts left-padded to one width, so every row still ends at the
  right edge; the new rows come last). `step(ids)` runs `q` new tokens per row (q = 1 for
  autoregressive decoding, up to B for block verification). They return fp32 logits (the last
  prompt position's [n, 1, V] for prefills, [b, q, V] for steps; a reduced-precision target's
  LM head runs at float32 where it decides: `verifier.full_logits.FullLogits`) and the tapped features
  [.., n_taps * H] (outputs of decoder layers `target_layer_ids`, before the final norm, i.e. HF
  `hidden_states[l + 1]`).
- `keep(counts)` keeps the first `counts[r]` of the last step's q tokens of row r and drops the
  rest (rollback after rejection). With full-attention layers only, the cache is a `kvcache.SlotLayer`
  per layer (appends in place) and rows that kept different counts simply mask out their rejected
  slots ("holes"), compacted by one gather once they take too much room; with sliding-window layers
  (windows are measured in slots) rows are re-aligned to the right edge after every such cycle.
  The recurrent layers' state is captured per position during multi-token steps and set per row
  by `keep` (`recurrent.RecurrentLayer.keep`); the attention layers' bookkeeping is unchanged.
- `step_tree(ids, depth, visible)` verifies a token tree per row (`decoding.proposers.tree`) in one pass:
  positions by depth, a 4-D attention mask (the committed context plus each node's ancestors);
  `keep_nodes(kept)` keeps the accepted path's slots and holes out the rest. Only for targets
  with `supports_trees` (full attention in slot layers); sliding-window and hybrid (recurrent)
  targets verify one path per row.
- `select_rows(rows)` drops finished sequences from the batch, and with them the leading slots no
  remaining row uses (full-attention layers), so a batch that keeps admitting rows stays as wide
  as its longest live row, not as the longest row it ever held.
- `verify(ids, tree)`: `step(ids)`, or `step_tree` for a `tree.TokenTree`.
- `aside()`: a context in which the adapter may run a batch of its own and after which the
  running batch is back as it was; `time_passes(sizes)`: the fastest of a few one-row passes of
  each size on a dummy context, aside (the cost model's start-up figures). `claim(session)`: the
  batch is one session's at a time (decoders over one adapter share it); another session's claim
  is refused while the holder still has rows, and `reset()` frees it.
- `features(input_ids, attention_mask)` is the cache-free pass used by training.
- `exact_verify=True` (`--exact-verify`, `decoding.verifier.exact`): every step and tree pass, one-
  token steps included, computes attention by `targets.exact_attention.attend` (each query as its
  one-token step computes it) and its products in chunks of at most 32 rows, so where the device's
  products are batch-invariant a verify pass gives each position the bits a plain step gives it,
  and greedy output equals plain decoding's (under the same option) at any precision.
"""
from __future__ import annotations

import contextlib
import math
import time
import weakref

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from dflash2.errors import require
from dflash2.decoding.verifier.exact import check_exact_verify
from dflash2.decoding.verifier.full_logits import FullLogits
from dflash2.decoding.verifier import recurrent
from dflash2.decoding.verifier.kvcache import SlotLayer
from dflash2.decoding.verifier.ragged import compaction_index, right_align, worth_compacting
from dflash2.targets import exact_attention
from dflash2.targets.delta_rule import capturing


def _left_pad(tensor: torch.Tensor, slots: int) -> torch.Tensor:
    """[b, heads, s, d] -> [b, heads, slots, d] with zeros entering on the left."""
    return F.pad(tensor, (0, 0, slots - tensor.shape[-2], 0))


def decoder_layers(model) -> torch.nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return decoder.layers


def context_limit(text_config) -> int:
    """The most positions a target's (text) config allows."""
    return getattr(text_config, "max_position_embeddings", 1 << 30)


class TargetAdapter:
    def __init__(self, model, target_layer_ids: list[int] | None = None, exact_verify: bool = False):
        self.model = model
        # float32 logits from a reduced-precision target (with --exact-verify, by batch-invariant products)
        self.full_logits = FullLogits(model, exact_attention.product if exact_verify else None)
        self.exact_verify = exact_verify
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.hybrid = recurrent.check_supported(model, self.config)
        if exact_verify:
            check_exact_verify(model, self.hybrid)
            exact_attention.install_invariant_products(model)
        self.recurrent: list[recurrent.RecurrentLayer] = []
        self.layers = decoder_layers(model)
        self.target_layer_ids = list(target_layer_ids or [])
        for layer_id in self.target_layer_ids:
            require(0 <= layer_id < len(self.layers),
                    f"target_layer_ids has {layer_id}, outside the target's {len(self.layers)} layers")
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = [self.layers[i].register_forward_hook(self._capture_hook(i)) for i in self.target_layer_ids]
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None        # [b, slots] 1 = real token
        self.next_position: torch.Tensor | None = None  # [b]
        self.holes = False                            # full-attention slot layers: rejected slots masked out
        self._holder = None                           # weak reference to the session whose batch this is

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return context_limit(self.config)

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def _capture_hook(self, layer_id: int):
        def hook(_module, _inputs, output):
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output
        return hook

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ------------------------------------------------------------------ forward passes
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, last_logits_only: bool = False,
                 attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._captured.clear()
        with torch.inference_mode(), self.full_logits.installed():
            out = self.model(input_ids=ids, attention_mask=self.mask if attention_mask is None else attention_mask,
                             position_ids=positions,
                             past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1 if last_logits_only else 0)
        features = None
        if self.target_layer_ids:
            features = torch.cat([self._captured[i] for i in self.target_layer_ids], dim=-1)
        self._captured.clear()
        return out.logits.float(), features

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 with_logits: bool = False) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Cache-free pass for training: tapped features [b, L, n_taps * H] (and fp32 logits).
        Runs under no_grad (not inference_mode) so the features can feed a training graph."""
        self._captured.clear()
        with torch.no_grad():
            if with_logits:
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits.float()
            else:  # stop after the deepest tapped layer would need model surgery; the LM head is skipped at least
                self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
                logits = None
        features = torch.cat([self._captured[i] for i in self.target_layer_ids], dim=-1)
        self._captured.clear()
        return logits, features

    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Start a batch with left-padded prompts; returns the last position's logits [b, 1, V] and
        the features of every position [b, L, F] (pads included)."""
        require(all(len(p) > 0 for p in prompts), "empty prompt: give at least one token")
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        self.cache = DynamicCache(config=self.model.config)
        self.cache.activate_past_recording()  # sliding-window layers must be able to roll back
        self.recurrent = recurrent.adopt(self.cache)
        self.holes = all(type(layer) is DynamicLayer for layer in self._attention_layers())
        if self.holes:
            storage = torch.float32 if self.exact_verify else None      # exact_attention attends in float32
            self.cache.layers = [SlotLayer(storage) if type(layer) is DynamicLayer else layer for layer in self.cache.layers]
        self.mask = mask
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.next_position = mask.sum(-1)
        out = self._forward(ids, positions, last_logits_only=True)
        for layer in self.recurrent:
            layer.zero_padding(mask)
        return out

    def _attention_layers(self) -> list:
        return [layer for layer in self.cache.layers if not isinstance(layer, recurrent.RecurrentLayer)]

    def add_rows(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Prefill `prompts` and append them to the running batch (or start one); returns what
        `prefill` returns for the new rows, and their own mask [n, L] (1 = real token)."""
        if self.cache is None:
            return (*self.prefill(prompts), self.mask)
        old_cache, old_mask, old_next = self.cache, self.mask, self.next_position
        logits, features = self.prefill(prompts)
        new_mask = self.mask
        width = max(old_mask.shape[1], self.mask.shape[1])
        for old_layer, new_layer in zip(old_cache.layers, self.cache.layers):
            if isinstance(new_layer, recurrent.RecurrentLayer):
                recurrent.merge(old_layer, new_layer)
                continue
            require(type(old_layer) in (DynamicLayer, DynamicSlidingWindowLayer, SlotLayer),
                    f"cache layer {type(old_layer).__name__} cannot take new rows")
            # stored slots are the last ones of each part: left-pad to one count, rows stay right-aligned
            stored = max(old_layer.keys.shape[-2], new_layer.keys.shape[-2])
            new_layer.keys = torch.cat([_left_pad(old_layer.keys, stored), _left_pad(new_layer.keys, stored)])
            new_layer.values = torch.cat([_left_pad(old_layer.values, stored), _left_pad(new_layer.values, stored)])
            if isinstance(new_layer, DynamicSlidingWindowLayer):
                new_layer.cumulative_length = width
        self.mask = torch.cat([F.pad(old_mask, (width - old_mask.shape[1], 0)),
                               F.pad(self.mask, (width - self.mask.shape[1], 0))])
        self.next_position = torch.cat([old_next, self.next_position])
        return logits, features, new_mask

    def step(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ids [b, q] at each row's next positions (the cache keeps them until `keep`)."""
        q = ids.shape[1]
        positions = self.next_position[:, None] + torch.arange(q, device=ids.device)
        self.mask = F.pad(self.mask, (0, q), value=1)
        for layer in self.recurrent:
            layer.begin_step(q)
        if self.recurrent and q > 1:  # capture each position's recurrent state for `keep`
            with capturing():
                return self._forward(ids, positions)
        with self._exactly():
            return self._forward(ids, positions)

    def _exactly(self):
        """With `exact_verify`, the context of a decoding pass: `exact_attention`'s attention and
        the batch-invariant products installed at construction."""
        return exact_attention.exact() if self.exact_verify else contextlib.nullcontext()

    def verify(self, ids: torch.Tensor, tree=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.step(ids) if tree is None else self.step_tree(ids, tree.depth, tree.visible)

    @property
    def supports_trees(self) -> bool:
        """Whether `step_tree` can run: full-attention layers only, kept in slot layers (holes allowed).
        Sliding windows count slots and recurrent layers carry one state per row: a tree's losing
        branch cannot be masked out of either, so those targets verify one path per row."""
        return self.cache is not None and self.holes and not self.recurrent

    def step_tree(self, ids: torch.Tensor, depth: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed a token tree per row: ids [b, W] at positions next_position + depth [b, W], node i
        attending to the committed context and to the nodes j with visible[:, i, j] ([b, W, W]);
        `keep_nodes` then keeps the accepted ones."""
        require(self.supports_trees, "this target cannot verify token trees (sliding-window or recurrent layers)")
        q = ids.shape[1]
        positions = self.next_position[:, None] + depth
        context = self.mask.bool()[:, None, :].expand(-1, q, -1)                      # [b, W, S]
        allowed = torch.cat([context, visible], dim=-1)[:, None]                       # [b, 1, W, S + W]
        bias = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        bias = bias.masked_fill(~allowed, torch.finfo(self.dtype).min)                 # additive: eager and sdpa alike
        self.mask = F.pad(self.mask, (0, q), value=1)
        with self._exactly():
            return self._forward(ids, positions, attention_mask=bias)

    # ------------------------------------------------------------------ cache bookkeeping
    def keep(self, counts: torch.Tensor, q: int) -> None:
        """Keep the first counts[r] (0..q) of the last step's q tokens of each row."""
        counts = counts.to(self.device)
        self.next_position = self.next_position + counts
        for layer in self.recurrent:
            layer.keep(counts)
        top = int(counts.max())
        if bool((counts == top).all()):
            if top < q:
                self.cache.crop(top - q)
                self.mask = self.mask[:, : top - q]
            return
        if self.holes:  # rows kept different counts: mask out each row's rejected slots
            self._hole_out(torch.arange(q, device=self.device)[None, :] < counts[:, None])
            return
        # Rows kept different counts: shift each row right so all rows end at the right edge again.
        shift = top - counts                                   # [b] extra left padding per row
        self.mask = right_align(self.mask, shift, top - q)
        for layer in self._attention_layers():
            require(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer),
                    f"cache layer {type(layer).__name__} cannot be rolled back per row")
            # keys / values [b, heads, slots, d] -> [b, slots, heads, d] so slots sit on dim 1
            keys = right_align(layer.keys.transpose(1, 2), shift, top - q).transpose(1, 2)
            values = right_align(layer.values.transpose(1, 2), shift, top - q).transpose(1, 2)
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.cumulative_length += top - q
                keep = layer.sliding_window - 1
                if layer.cumulative_length >= layer.sliding_window:
                    keys, values = keys[:, :, -keep:], values[:, :, -keep:]
            layer.keys, layer.values = keys.contiguous(), values.contiguous()

    def keep_nodes(self, kept: torch.Tensor) -> None:
        """After `step_tree`: keep the nodes kept[r] ([b, W] bool) of each row and hole out the rest
        (the losing branch and the rejected nodes). Kept nodes lie on one path, in depth order, so
        the row's slots stay in time order."""
        kept = kept.to(self.device)
        self.next_position = self.next_position + kept.sum(dim=1)
        self._hole_out(kept)

    def _hole_out(self, kept: torch.Tensor) -> None:
        """Mask out the last step's slots that kept [b, q] does not keep; crop the trailing ones no
        row keeps; compact by one gather once holes take too much room."""
        q = kept.shape[1]
        self.mask[:, -q:] = kept.to(self.mask.dtype)
        used = kept.any(dim=0)                                                          # [q]
        unused_tail = q - (int(used.nonzero().max()) + 1 if bool(used.any()) else 0)
        if unused_tail:
            self.cache.crop(-unused_tail)
            self.mask = self.mask[:, :-unused_tail]
        if worth_compacting(self.mask):
            index = compaction_index(self.mask)                                            # [b, S']
            for layer in self._attention_layers():
                slots = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
                layer.keys, layer.values = layer.keys.gather(2, slots), layer.values.gather(2, slots)
            self.mask = self.mask.gather(1, index)

    def select_rows(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.device)
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.next_position = self.next_position[rows]
        self._drop_shared_padding()

    def _drop_shared_padding(self, minimum: int = 16) -> None:
        """Cut the leading slots that are padding in every remaining row (left by the longer rows
        that finished), once there are at least `minimum`: a batch that keeps admitting rows would
        otherwise attend over them for as long as it runs. Full-attention layers only (windows are
        counted in slots)."""
        if not all(type(layer) in (DynamicLayer, SlotLayer) for layer in self.cache.layers):
            return
        used = self.mask.any(dim=0)                                                     # [S]
        first = int(used.int().argmax()) if bool(used.any()) else 0
        if first < minimum:
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        self.mask = self.mask[:, first:]

    def reset(self) -> None:
        self.cache = self.mask = self.next_position = self._holder = None
        self.recurrent = []

    def claim(self, session) -> None:
        holder = self._holder() if self._holder is not None else None
        require(holder is None or holder is session or not holder.rows,
                "this target is decoding another session's batch: decoders over one target take turns")
        self._holder = weakref.ref(session)

    @contextlib.contextmanager
    def aside(self):
        """Put the running batch aside (cache, mask, positions, recurrent layers) and bring it back after."""
        saved = (self.cache, self.mask, self.next_position, self.recurrent, self.holes)
        try:
            yield self
        finally:
            self.cache, self.mask, self.next_position, self.recurrent, self.holes = saved

    def time_passes(self, sizes: list[int], context: int = 32, repeats: int = 2) -> dict[int, float]:
        """{q: seconds}, the fastest of `repeats` passes of q tokens (one row) on a dummy context of
        `context` tokens (a first pass is cold), with the running batch set aside."""
        out: dict[int, float] = {}
        with self.aside():
            self.prefill([[(7 * i + 3) % self.vocab_size for i in range(context)]])
            for q in sizes * repeats:
                ids = torch.full((1, q), 5 % self.vocab_size, dtype=torch.long, device=self.device)
                start = time.perf_counter()
                self.step(ids)
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                out[q] = min(time.perf_counter() - start, out.get(q, math.inf))
                self.keep(torch.zeros(1, dtype=torch.long), q)
        return out
