"""Attention whose every query of a pass computes exactly what its one-token step computes.

Contract:
- `exact()`: a context in which `grouped_attention` (the built-in Llama's attention, and every
  transformers `sdpa` model the engine runs) computes every pass's attention, one-token steps
  included, by `attend`. `active()` says whether it is on.
- `attend(q, k, v, mask, scale)`: q [b, heads, L, d], k and v [b, kv_heads, S, d], mask None, bool
  or additive of shape [b or 1, 1 or heads, L, S] -> [b, heads, L, d] in q's dtype. Each query
  attends in float32 (q, k, v upcast exactly; one rounding, of the output) over a window of keys:
  its visible keys in slot order first, then masked slots, the window's width a multiple of WIDTH:
  `bucket(n)` for a one-token step's n keys, and the same for each query of a pass: a row's
  window (its committed keys and the block's) at each of its queries' widths, the queries of one
  width in one call of up to CALL_ROWS rows (query heads folded onto their KV heads: row g * n +
  i; a block whose key counts cross a multiple of WIDTH makes two calls); a token tree's nodes
  each their own window. So a query computes in a pass what it computes in the one-token step,
  with holes, left padding and trees, where the kernel (PyTorch's CPU flash attention) gives a
  query row (1) the same bits among 4..CALL_ROWS rows of a call (MKL's float32 products; one to
  three rows take other kernels on an AMD EPYC, one or two on an Intel Xeon: calls get at least
  MIN_ROWS, repeating a query) and (2) the same bits whatever the masked slots after its keys hold
  (masked keys add exact zeros). One width for the whole block is not enough: on an AMD EPYC,
  MKL reduces a query's 190 keys otherwise in a window of 256 than in one of 192 (widths 192, 256,
  320, 704, 768 and 832 among those up to 1,088).
  `attention_invariant` probes these on the device, the tests on this CPU. Without the widths a
  pass's query, whose keys the later ones of its block pad, rounds otherwise than its one-token
  step; bfloat16 attention is out because oneDNN's bfloat16 products (the kernel's) round a row
  otherwise as the row count changes. Plain decoding under `exact()` therefore differs from plain
  decoding without it (another attention arithmetic, the same precision): speculative output
  equals the former. A pass's calls are planned once from its mask and reused by every layer. A
  window is a view where k and v are float32 views of a buffer registered by `mark_finite_room`
  (the cache's: `kvcache.SlotLayer`, whose room past the filled part holds zeros or cropped keys),
  read past their end as masked slots; else a copy.
- `mark_finite_room(buffer)` / `has_finite_room(tensor)`: the registry of such buffers (by
  storage, while the buffer lives).
- `product(op, x)`: op(x) for x [.., in] -> [.., out], in calls of MIN_PRODUCT_ROWS..CHUNK_ROWS
  rows: a wider pass in consecutive chunks, a narrower one padded with zero rows (dropped after).
  So a one-token step multiplies as a verify pass's rows do: oneDNN's bfloat16 one-row product is
  a kernel of its own on an AMD EPYC without AMX (the 576 x 1536 down projection rounds some rows
  otherwise alone than among 2..32; padded to 2 rows, every row of 2..32 gets the same bits).
- `batch_invariant(shapes, dtype, device)` -> (bool, what failed): whether this device's matrix
  products of the given (out, in) shapes, run by `product`, give each row the same bits alone as
  among 2..CHUNK_ROWS rows (the other half of an exact verify pass: its linear layers see q rows
  per sequence where the one-token step sees one); `packed=True` probes oneDNN's packed kernel
  (`model.projections`), what dflash2's Llama multiplies by on a CPU. oneDNN's bfloat16 kernels on
  x86 CPUs with avx512_bf16 (an AMD EPYC) or AMX (an Intel Xeon) hold; from 33 rows on another
  kernel class reduces otherwise. Float32 `F.linear` (MKL) does not (its kernels change with the
  row count); oneDNN's packed float32 kernel (layout for 8 rows) does on an AVX2-only AMD EPYC.
  GPU kernels in general do not (split reductions chosen by shape).
- `attention_invariant(kv_heads, groups, head_dim, dtype, device)` -> (bool, what failed): whether
  `attend` gives every query of passes of several lengths (chains crossing a width, more queries
  than one call takes, left padding and a hole) the float32 bits of its one-token step, on random
  data of the target's head shape.
- `install_invariant_products(model)`: once per model, every `nn.Linear` of it, and every op of
  its own that dflash2's Llama multiplies through (`projections.Projection`), multiplies by
  `product` while `exact()` is on (and as before otherwise), so every pass, one-token steps and
  batches of verify blocks alike, stays in one kernel class. Installed once rather than around
  each pass: patching some 300 modules took 1.8 ms a pass, 6 % of a plain step.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import weakref

import torch
import torch.nn.functional as F

from dflash2.model import projections

_ACTIVE = contextvars.ContextVar("dflash2_exact_attention", default=None)   # the pass's plans while on
_INSTALLED = "_dflash2_invariant_products"     # a model's flag: `install_invariant_products` ran
CHUNK_ROWS = 32      # products of at most this many rows: the largest batch-invariant kernel class measured
MIN_PRODUCT_ROWS = 2  # ... and at least this many (oneDNN's bfloat16 one-row product is another kernel on AVX512 without AMX)
PROBE_ROWS = tuple(range(2, CHUNK_ROWS + 1))
WIDTH = 64           # windows of keys are padded (masked) to a multiple of this
CALL_ROWS = 32       # query rows per attention call: the kernel's block of rows (one gemm per block)
MIN_ROWS = 4         # and at least this many (MKL multiplies one to three rows with other kernels on an AMD EPYC)


@contextlib.contextmanager
def exact():
    token = _ACTIVE.set({})
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    return _ACTIVE.get() is not None


def bucket(count: int) -> int:
    """The key count a query with `count` visible keys attends over: the next multiple of WIDTH."""
    return -(-max(count, 1) // WIDTH) * WIDTH


def _visible(mask: torch.Tensor) -> torch.Tensor:
    """bool or additive mask -> bool, True where a query may attend."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


@dataclasses.dataclass(frozen=True)
class _Call:
    """One kernel call of a pass: some queries of one row over one window of `width` keys."""
    row: int
    queries: slice | torch.Tensor   # the queries (places in the pass; a tensor where one repeats or they skip)
    run: slice | torch.Tensor       # the window's visible slots: a run of slots, or their indices
    pad: int                        # masked slots after them: the window is run + pad = width keys
    mask: torch.Tensor              # [1, 1, groups * n, width] float32, additive: 0 on a query's first `count` keys


def _window(slots: torch.Tensor, width: int) -> tuple[slice | torch.Tensor, int]:
    """The first `width` of `slots` (slot order) as a run where they are one, and the masked padding."""
    slots = slots[:width]
    first, last = int(slots[0]), int(slots[-1]) + 1
    return (slice(first, last) if last - first == slots.numel() else slots), width - slots.numel()


def _plan(mask: torch.Tensor | None, b: int, length: int, slots: int, groups: int, device) -> list[_Call]:
    """The calls of a pass (the same for every layer; see the contract)."""
    if mask is None:   # no padding: query l sees every slot up to its own (the pass's are the last L)
        allowed = (torch.arange(slots, device=device)[None, :]
                   <= torch.arange(slots - length, slots, device=device)[:, None]).expand(b, length, slots)
    else:              # [b|1, 1|heads, rows, S] -> [b, L, S]: head 0's first L rows (trees and padding are shared by heads)
        allowed = _visible(mask)[:, 0, :length].expand(b, length, slots)
    counts = allowed.sum(-1)                                                       # [b, L]
    union = allowed.any(1)                                                         # [b, S]
    rank = union.cumsum(-1)                                                        # [b, S]
    # a query whose keys are the first `count` of its row's union shares the row's window
    prefix = (allowed == (union[:, None] & (rank[:, None] <= counts[..., None]))).all(-1).all(-1).tolist()   # [b]
    per_call = max(1, CALL_ROWS // groups)            # queries per call: at most CALL_ROWS rows
    calls = []
    for r, row_counts in enumerate(counts.tolist()):
        if prefix[r]:      # the row's window at each query's own width (a block crossing a multiple of WIDTH: two)
            by_width: dict[int, list[int]] = {}
            for l, n in enumerate(row_counts):
                by_width.setdefault(bucket(n), []).append(l)
            seen = union[r].nonzero().squeeze(-1)
            windows = [(seen, width, queries) for width, queries in by_width.items()]
        else:              # a token tree: every node its own window
            windows = [(allowed[r, l].nonzero().squeeze(-1), bucket(n), [l]) for l, n in enumerate(row_counts)]
        for seen, width, queries in windows:
            run, pad = _window(seen, width)
            for start in range(0, len(queries), per_call):
                part = queries[start:start + per_call]
                while len(part) * groups < MIN_ROWS:                        # fewer rows take another kernel
                    part = part + part[-1:]
                n = counts[r, part][None, :].expand(groups, -1).reshape(-1)   # [groups * n]: row g * n + i
                hidden = torch.arange(width, device=device)[None, :] >= n[:, None]
                consecutive = part == list(range(part[0], part[0] + len(part)))
                calls.append(_Call(row=r, run=run, pad=pad,
                                   queries=slice(part[0], part[-1] + 1) if consecutive else torch.tensor(part, device=device),
                                   mask=torch.zeros(hidden.shape, device=device).masked_fill(hidden, float("-inf"))[None, None]))
    return calls


_FINITE_ROOM: dict[int, weakref.ref] = {}      # storage address -> the buffer that owns it


def mark_finite_room(buffer: torch.Tensor) -> None:
    """Declare that `buffer`'s storage holds finite values only (keys, values or zeros), so `attend`
    may read past a view's end as masked slots while the buffer lives."""
    for address in [a for a, ref in _FINITE_ROOM.items() if ref() is None]:
        del _FINITE_ROOM[address]
    _FINITE_ROOM[buffer.untyped_storage().data_ptr()] = weakref.ref(buffer)


def has_finite_room(tensor: torch.Tensor) -> bool:
    ref = _FINITE_ROOM.get(tensor.untyped_storage().data_ptr())
    owner = None if ref is None else ref()
    return owner is not None and owner.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()


def _keys(k: torch.Tensor, call: _Call, zeros: torch.Tensor) -> torch.Tensor:
    """k [b, kv_heads, S, d] -> the call's window [1, kv_heads, width, d] in float32 (exactly): a
    view where k is a float32 view of a buffer with finite room after it (`kvcache.SlotLayer`),
    else a copy."""
    if isinstance(call.run, slice) and k.dtype == torch.float32 and has_finite_room(k):
        kv_heads, _, d = k.shape[1:]
        start = k.storage_offset() + call.row * k.stride(0) + call.run.start * k.stride(2)
        width = call.run.stop - call.run.start + call.pad
        last = start + (kv_heads - 1) * k.stride(1) + (width - 1) * k.stride(2) + (d - 1) * k.stride(3)
        if last < k.untyped_storage().nbytes() // k.element_size():   # past a head's room: the next head's keys
            return k.as_strided((1, kv_heads, width, d), (0, k.stride(1), k.stride(2), k.stride(3)), start)
    seen = k[call.row, :, call.run] if isinstance(call.run, slice) else k[call.row].index_select(1, call.run)
    window = torch.cat([seen, zeros[:, :call.pad]], dim=1) if call.pad else seen.float()   # cat: float32
    return window[None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           scale: float | None) -> torch.Tensor:
    b, heads, length, d = q.shape
    kv_heads, slots = k.shape[1], k.shape[2]
    plans = {} if _ACTIVE.get() is None else _ACTIVE.get()
    key = (id(mask), b, length, slots)
    if key not in plans:
        plans[key] = (mask, _plan(mask, b, length, slots, heads // kv_heads, q.device))   # the mask held: its id stays its own
    calls = plans[key][1]
    zeros = plans.get(("zeros", kv_heads, d))                # the masked slots' keys and values
    if zeros is None or zeros.shape[1] < max(call.pad for call in calls):
        zeros = plans[("zeros", kv_heads, d)] = q.new_zeros(kv_heads, max(WIDTH, *(call.pad for call in calls)), d,
                                                            dtype=torch.float32)
    q32 = q.float()
    out = None if len(calls) == 1 and b == 1 else q.new_empty(b, heads, length, v.shape[-1])
    for call in calls:
        mine = q32[call.row][:, call.queries] if isinstance(call.queries, slice) else q32[call.row].index_select(1, call.queries)
        count = mine.shape[1]
        # [heads, n, d] -> [1, kv_heads, groups * n, d]: a KV head's query heads folded onto it (row g * n + i)
        res = F.scaled_dot_product_attention(mine.reshape(1, kv_heads, -1, d), _keys(k, call, zeros),
                                             _keys(v, call, zeros), attn_mask=call.mask, scale=scale)
        res = res.reshape(heads, count, v.shape[-1])                             # [heads, n, d]
        if out is None and isinstance(call.queries, slice) and count == length:   # the pass in one call
            return res[None].to(q.dtype)
        if out is None:
            out = q.new_empty(b, heads, length, v.shape[-1])
        if isinstance(call.queries, slice):
            out[call.row, :, call.queries] = res
        else:                                  # (a query given twice writes the same bits twice)
            out[call.row].index_copy_(1, call.queries, res.to(out.dtype))
    return out


def product(op, x: torch.Tensor) -> torch.Tensor:
    """op(x), the rows of x [.., in] multiplied in calls of MIN_PRODUCT_ROWS..CHUNK_ROWS rows."""
    flat = x.reshape(-1, x.shape[-1])                                              # [n, in]
    n = flat.shape[0]
    if MIN_PRODUCT_ROWS <= n <= CHUNK_ROWS:
        return op(x)
    if n < MIN_PRODUCT_ROWS:
        out = op(torch.cat([flat, flat.new_zeros(MIN_PRODUCT_ROWS - n, flat.shape[-1])]))[:n]   # [n, out]
    else:
        out = torch.cat([product(op, part) for part in flat.split(CHUNK_ROWS)])   # the last chunk padded if short
    return out.reshape(*x.shape[:-1], out.shape[-1])


def install_invariant_products(model) -> None:
    """Once per model (see the contract): its linears and own ops multiply by `product` while
    `exact()` is on, as they did before otherwise."""
    if getattr(model, _INSTALLED, False):
        return
    for linear in [m for m in model.modules() if isinstance(m, torch.nn.Linear)]:
        own = vars(linear).get("forward")      # a forward someone else installed, else nn.Linear's arithmetic
        linear.forward = _Invariant(own or (lambda x, linear=linear: F.linear(x, linear.weight, linear.bias)))
    # dflash2's Llama multiplies through ops of its own (`projections.Projection`, module attributes with `parts`)
    for owner, name, op in [(m, n, op) for m in model.modules() for n, op in list(vars(m).items()) if hasattr(op, "parts")]:
        setattr(owner, name, _Invariant(op))
    setattr(model, _INSTALLED, True)


class _Invariant:
    """`op`, run by `product` while `exact()` is on; its other attributes (`sizes`, `weight`,
    `refresh`, ...) the op's own."""

    def __init__(self, op):
        self.op = op

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return product(self.op, x) if active() else self.op(x)

    def __getattr__(self, name: str):
        if name == "op":          # not set yet (a copy being built): no recursion through getattr
            raise AttributeError(name)
        return getattr(self.op, name)


def batch_invariant(shapes: list[tuple[int, int]], dtype: torch.dtype, device: str,
                    rows: tuple[int, ...] = PROBE_ROWS, packed: bool = False) -> tuple[bool, str]:
    """Probe this device's products (random weights of each (out, in) shape, see the contract);
    `packed`: oneDNN's packed kernel (`projections.pack`), what dflash2's Llama multiplies by on a CPU."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    for out_features, in_features in sorted(set(shapes)):
        weight = (torch.randn(out_features, in_features, generator=generator) * 0.05).to(device, dtype)
        x = torch.randn(max(rows), in_features, generator=generator).to(device, dtype)
        op = (lambda r, w=projections.pack(weight): projections.packed_product(r, w)) if packed else (
            lambda r: F.linear(r, weight))
        n = projections.rows_differ(lambda part, op=op: product(op, part), x, rows)
        if n is not None:
            return False, f"a {out_features} x {in_features} {str(dtype).removeprefix('torch.')} product of {n} rows"
    return True, ""


def attention_invariant(kv_heads: int, groups: int, head_dim: int, dtype: torch.dtype, device: str,
                        contexts: tuple[int, ...] = (40, 190, 600)) -> tuple[bool, str]:
    """Probe `attend` on this device (random data of the target's head shape, see the contract):
    every query of a pass (blocks of verify tokens of several lengths whose key counts cross a
    width, up to more queries than one call takes; a second row with left padding and a hole; keys
    read in place from a buffer with room) gets the bits of the one-token step that computes it
    alone over its own keys (copied windows)."""
    generator = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):   # values of `dtype`, held in float32: `attend`'s result is compared before rounding
        return torch.randn(*shape, generator=generator).to(dtype).to(device, torch.float32)
    with exact():
        for context in contexts:
            for length in sorted({2, 3, 5, 8, CALL_ROWS // groups + 3}):
                slots = context + length
                q = rand(2, kv_heads * groups, length, head_dim)
                # the pass reads keys and values as a cache holds them: views of buffers with room after them
                buffers = torch.zeros(2, 2, kv_heads, slots + WIDTH, head_dim, device=device)
                buffers[:, :, :, :slots] = rand(2, 2, kv_heads, slots, head_dim)
                mark_finite_room(buffers)
                k, v = buffers[0, :, :, :slots], buffers[1, :, :, :slots]
                allowed = (torch.arange(slots)[None, :] <= torch.arange(context, slots)[:, None]).repeat(2, 1, 1)   # [2, L, S]
                allowed[1, :, :5] = allowed[1, :, 7] = False                   # row 1: left padding and a hole
                allowed = allowed.to(device)
                together = attend(q, k, v, allowed[:, None], None)
                for r in range(2):
                    for l in range(length):
                        seen = allowed[r, l].nonzero().squeeze(-1)
                        alone = attend(q[r:r + 1, :, l:l + 1], k[r:r + 1].index_select(2, seen),
                                       v[r:r + 1].index_select(2, seen), None, None)
                        if not torch.equal(together[r:r + 1, :, l:l + 1], alone):
                            return False, (f"attention over {seen.numel()} keys gives a query of a {length}-token "
                                           "pass other bits than its one-token step")
    return True, ""
