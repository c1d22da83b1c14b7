"""The target's logits at float32 whatever the precision of its weights, at almost no cost.

Contract: `FullLogits(model, multiply)` prepares a target whose LM head runs in bfloat16 or float16
(`.active`; a float32 model needs nothing). Inside `with full.installed():` each pass of the model
computes its final norm at float32 (a float32 copy of the norm module, on its input upcast) and
its LM head as follows, per row x (the float32 norm output) and token j:
- z_j = head(x_r) by the model's own reduced-precision kernel, x_r being x rounded to the weights'
  dtype (fp32 accumulation, output rounded), is within E of the float32 product x . W_j for every
  token near the top: E = (A + gamma * S + u * |max_j z_j|) / (1 - 2u), where A = sum_i |x_i -
  x_r,i| c_i bounds what rounding x moved (c_i = max_j |W_ji|, a column bound of the head's weight
  made once), S = sum_i |x_i| c_i, gamma = hidden size x 2^-24 bounds the fp32 accumulation and u
  (half the dtype's machine epsilon) the rounding of the output, for any |z_j| up to |max z| + 2E;
- every token within 2E of the row's largest z_j is recomputed at float32, x . W_j (+ bias) with
  the weight row upcast: no other token can have the larger float32 logit, so the argmax, and
  every logit that can decide it, is the float32 head's. The others keep their reduced value
  (off by at most E, and at least 2E below the top: they cannot matter to greedy decoding and
  move a sampled distribution by at most E per logit).
Measured on SmolLM2 in bfloat16 (2-core EPYC, docs/precision.md): a handful of tokens per
row are recomputed; a float32 head for the whole vocabulary (a float32 copy of the weight, 113
MB) cost 3.4x the bfloat16 head for an 8-token verify pass, this about 1 %.
The head's reduced-precision product is the model's own: `lm_head` for a transformers model, the
op over `lm_head`'s weight that dflash2's Llama calls instead (`model.projections.Projection`,
prepacked on the CPU), found as the model attribute whose `parts` are `(lm_head,)`.
Every float32 computation is per row (no reduction spans rows), and the head's own product runs
as `multiply(op, x)` calls it (default op(x)), so a row's logits depend on how many rows its pass
has only as much as that kernel's do (`--exact-verify`: `exact_attention.product`, batch-invariant).
Outside `installed()` the model is as loaded (Hugging Face's own `generate()` in the bench's peers, training).
"""
from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F


def own_head_op(model, head) -> str | None:
    """The name of the model's own op over `head`'s weight that its forward calls instead of `head`
    (dflash2's Llama: a `Projection`), or None (the model calls `head`)."""
    for name, value in vars(model).items():
        if getattr(value, "parts", None) == (head,):
            return name
    return None


def direct(op, x: torch.Tensor) -> torch.Tensor:
    """The head's product as the kernel runs it (any number of rows in one call)."""
    return op(x)


def near_top(z: torch.Tensor, threshold: torch.Tensor, block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, tokens) of every z[r, j] >= threshold[r], z [n, V]: the maxima of blocks of `block`
    tokens first, then only the blocks that reach the threshold (one or two a row), and the last
    V mod block tokens directly. A comparison of every logit and its `nonzero` cost 0.5 ms of an
    8-token bf16 verify pass on a 2-core EPYC (V = 49,152), this about 0.1."""
    z = z if z.stride(-1) == 1 else z.contiguous()                                 # the view below needs unit steps
    n, vocab = z.shape
    whole = vocab // block
    blocks = z.as_strided((n, whole, block), (z.stride(0), block, 1))              # [n, V // block, block]
    rows, first = (blocks.amax(dim=-1) >= threshold[:, None]).nonzero(as_tuple=True)  # [h] blocks that reach it
    tokens = first[:, None] * block + torch.arange(block, device=z.device)            # [h, block]
    keep = z[rows[:, None], tokens] >= threshold[rows, None]                        # [h, block]
    rows, tokens = rows[:, None].expand_as(tokens)[keep], tokens[keep]
    if vocab % block:
        tail_rows, tail = (z[:, whole * block:] >= threshold[:, None]).nonzero(as_tuple=True)
        rows, tokens = torch.cat([rows, tail_rows]), torch.cat([tokens, tail + whole * block])
    return rows, tokens


def final_norm(model) -> torch.nn.Module | None:
    """The norm applied to the last hidden state before the LM head (`decoder.norm`), if named so."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    norm = getattr(decoder, "norm", None)
    return norm if isinstance(norm, torch.nn.Module) else None


class FullLogits:
    def __init__(self, model, multiply=None):
        head = model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        self.active = (isinstance(head, torch.nn.Linear) and weight is not None
                       and weight.dtype in (torch.bfloat16, torch.float16))
        if not self.active:
            return
        self.head, self.norm = head, final_norm(model)
        self.model, self.op_name = model, own_head_op(model, head)
        own = getattr(model, self.op_name) if self.op_name else None
        self.product = own if own is not None else (lambda x: F.linear(x, head.weight, head.bias))  # the reduced head
        self.multiply = multiply or direct                # `--exact-verify`: exact_attention.product
        self.norm32 = copy.deepcopy(self.norm).float() if self.norm is not None else None
        with torch.no_grad():
            self.column_bound = weight.detach().abs().amax(dim=0).float()           # [H] c_i = max_j |W_ji|
        self.unit = 0.505 * torch.finfo(weight.dtype).eps   # unit roundoff (eps / 2), with room for second-order terms
        self.gamma = weight.shape[1] * 2.0 ** -24
        self.recomputed = 0          # tokens recomputed at float32 (for measurements)
        self.rows = 0

    @contextlib.contextmanager
    def installed(self):
        if not self.active:
            yield
            return
        head_site = (self.model, self.op_name) if self.op_name else (self.head, "forward")
        swapped = [(*head_site, self._head_forward)] + (
            [(self.norm, "forward", self._norm_forward)] if self.norm is not None else [])
        before = [vars(owner).get(name) for owner, name, _ in swapped]    # what was installed there before
        for owner, name, forward in swapped:
            setattr(owner, name, forward)
        try:
            yield
        finally:
            for (owner, name, _), previous in zip(swapped, before):
                if previous is None:
                    delattr(owner, name)
                else:
                    setattr(owner, name, previous)

    def _norm_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm32(hidden.float())

    def _head_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight, bias = self.head.weight, self.head.bias
        shape = hidden.shape
        x = hidden.float().reshape(-1, shape[-1])                                        # [n, H]
        rounded = x.to(weight.dtype)
        z = self.multiply(self.product, rounded).float()                                 # [n, V]
        spread = (x.abs() * self.column_bound).sum(dim=-1)                               # [n] sum_i |x_i| c_i
        inexact = ((x - rounded.float()).abs() * self.column_bound).sum(dim=-1)          # [n] A
        top = z.amax(dim=-1)
        bound = (inexact + self.gamma * spread + self.unit * top.abs()) / (1 - 2 * self.unit)   # [n] E
        rows, tokens = near_top(z, top - 2 * bound)
        exact = (weight[tokens].float() * x[rows]).sum(dim=-1)                           # [k] x . W_j at fp32
        if bias is not None:
            exact = exact + bias[tokens].float()
        z[rows, tokens] = exact
        self.recomputed += int(tokens.numel())
        self.rows += x.shape[0]
        return z.reshape(*shape[:-1], z.shape[-1])
