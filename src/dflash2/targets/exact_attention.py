"""Attention whose every query row computes exactly what a one-token step computes for it.

Contract:
- `per_query()`: a context in which `grouped_attention` (the built-in Llama's attention, and every
  transformers `sdpa` model the engine runs) computes attention by `attend_per_query` instead of
  one call for the whole pass. `active()` says whether it is on.
- `attend_per_query(q, k, v, mask, scale)`: q [b, heads, L, d], k and v [b, kv_heads, S, d], mask
  None, bool or additive of shape [b or 1, 1 or heads, L, S] -> [b, heads, L, d]. Each row's each
  query attends, in one kernel call of its own, to exactly the slots it may see (taken in slot
  order; a contiguous run is a view, holes and token trees are gathered), without a mask, its
  query heads folded onto their KV heads as a one-token step folds them: the same call, on the
  same keys, that a one-token step of plain decoding makes at batch 1. Why: the kernels reduce
  over the key axis in an order that depends on the number of keys (vector tails, block splits),
  so a query of a verify pass, which sees its keys padded by the later, masked ones, rounds
  otherwise than the one-token step; in bfloat16 a rounding difference moves the logits by
  0.1-1 (measured on SmolLM2), enough to turn near-ties.
- `batch_invariant(shapes, dtype, device)` -> (bool, what failed): whether this device's matrix
  products of the given (out, in) shapes give each row the same bits alone as among 2..CHUNK_ROWS
  rows (the other half of an exact verify pass: its linear layers see q rows per sequence where
  the one-token step sees one). oneDNN's bfloat16 kernels on an x86 CPU with avx512_bf16 hold up
  to 32 rows (from 33 rows on another kernel class reduces otherwise, measured on a 2-core EPYC);
  its float32 products (MKL) do not (a one-row product takes another kernel), nor, in general, GPU
  kernels (split reductions chosen by shape).
- `chunked_rows(model)`: a context in which every `nn.Linear` of `model`, and every op of its own
  that dflash2's Llama multiplies through (`projections.Projection`), multiplies at most
  CHUNK_ROWS rows per kernel call (a pass's rows in consecutive chunks), so a wide pass (a batch
  of verify blocks) stays in the kernel class a one-token step uses.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F

_ACTIVE = contextvars.ContextVar("dflash2_exact_attention", default=False)
CHUNK_ROWS = 32      # products of at most this many rows: the largest batch-invariant kernel class measured
PROBE_ROWS = tuple(range(2, CHUNK_ROWS + 1))


@contextlib.contextmanager
def per_query():
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    return _ACTIVE.get()


def _visible(mask: torch.Tensor) -> torch.Tensor:
    """bool or additive mask -> bool, True where a query may attend."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def attend_per_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float | None) -> torch.Tensor:
    b, heads, length, d = q.shape
    kv_heads, slots = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    # [b|1, 1|heads, rows, S] -> [b, L, S]: the first L rows are the first query head's (a folded
    # mask repeats them per head; a per-head mask takes head 0's: padding, causality and trees are shared)
    allowed = None if mask is None else _visible(mask)[:, 0, :length].expand(b, length, slots)
    rows = []
    for r in range(b):
        outs = []
        for l in range(length):
            if allowed is None:   # no padding: query l sees every slot up to its own (the pass's are the last L)
                keys, values = k[r:r + 1, :, :slots - length + l + 1], v[r:r + 1, :, :slots - length + l + 1]
            else:
                keys, values = _seen(k[r:r + 1], v[r:r + 1], allowed[r, l])
            query = q[r:r + 1, :, l:l + 1].reshape(1, kv_heads, groups, d)           # one-token fold
            out = F.scaled_dot_product_attention(query, keys, values, scale=scale)    # [1, kv, groups, d]
            outs.append(out.reshape(1, heads, 1, v.shape[-1]))
        rows.append(torch.cat(outs, dim=2))
    return torch.cat(rows, dim=0)


def _seen(k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [1, kv, S, d] -> the slots `allowed` [S] marks, in slot order."""
    index = allowed.nonzero().squeeze(-1)
    first, last = int(index[0]), int(index[-1]) + 1
    if last - first == index.numel():            # one contiguous run (left padding only): a view
        return k[:, :, first:last], v[:, :, first:last]
    return k.index_select(2, index), v.index_select(2, index)


@contextlib.contextmanager
def chunked_rows(model, rows: int = CHUNK_ROWS):
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # dflash2's Llama multiplies through ops of its own (`projections.Projection`, module attributes with `parts`)
    ops = [(m, name, op) for m in model.modules() for name, op in list(vars(m).items()) if hasattr(op, "parts")]

    def chunked(product):
        def forward(x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape(-1, x.shape[-1])                                          # [n, in]
            if flat.shape[0] <= rows:
                return product(x)
            out = torch.cat([product(part) for part in flat.split(rows)])
            return out.reshape(*x.shape[:-1], out.shape[-1])
        return forward
    before = [vars(linear).get("forward") for linear in linears]     # a forward someone else installed
    for linear in linears:
        linear.forward = chunked(lambda x, linear=linear: F.linear(x, linear.weight, linear.bias))
    for owner, name, op in ops:
        setattr(owner, name, _Chunked(op, chunked(op)))
    try:
        yield
    finally:
        for linear, forward in zip(linears, before):
            if forward is None:
                del linear.forward
            else:
                linear.forward = forward
        for owner, name, op in ops:
            setattr(owner, name, op)


class _Chunked:
    """An op whose calls run chunked, its other attributes (`sizes`, `weight`, ...) the op's own."""

    def __init__(self, op, forward):
        self.op, self.forward = op, forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def __getattr__(self, name: str):
        return getattr(self.op, name)


def batch_invariant(shapes: list[tuple[int, int]], dtype: torch.dtype, device: str,
                    rows: tuple[int, ...] = PROBE_ROWS) -> tuple[bool, str]:
    """Probe this device's products (random weights of each (out, in) shape, see the contract)."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    for out_features, in_features in sorted(set(shapes)):
        weight = (torch.randn(out_features, in_features, generator=generator) * 0.05).to(device, dtype)
        x = torch.randn(max(rows), in_features, generator=generator).to(device, dtype)
        alone = torch.cat([F.linear(x[i:i + 1], weight) for i in range(x.shape[0])])
        for n in rows:
            if not torch.equal(F.linear(x[:n], weight), alone[:n]):
                return False, f"a {out_features} x {in_features} {str(dtype).removeprefix('torch.')} product of {n} rows"
    return True, ""
