"""The built-in Llama's projections for decoding: Q, K, V (and gate, up) in one matmul, on prepacked
oneDNN weights where that computes the same thing faster.

Contract:
- `Projection(*parts)` (bias-free `nn.Linear`s with one input size) computes `cat([p(x) for p in
  parts], -1)`, [.., in] -> [.., sum(out)]; `sizes` are the parts' output sizes, for splitting.
  The parts keep their parameters (names, hence `state_dict()`, unchanged); `refresh(pack)` makes
  them views of one weight concatenated along the output dimension ([sum(out), in], no extra
  memory), so each output is still its own weight row's dot product with x, and keeps the weight
  in a `form` (`FORMATS`) besides: "packed" (CPU only: oneDNN's layout, `PACKED_ROWS_HINT` the
  pass size it is laid out for; one more copy of the weight), "plain" (nothing more), or "int8" /
  "int4" (`model.quantized`: a quantized target, not the float one; passes of up to
  `QUANTIZED_ROWS` rows, every decoding step and verify pass of a small batch and every product
  under `--exact-verify`, multiply by the quantized weight, whose kernel gives each row the same
  bits alone or among others; wider passes, prefills and wide batches, by its dequantized copy in
  the activations' dtype: the quantized kernel's time grows with the rows, 13x the bf16 kernel's
  at 300 rows, where a prefill is compute-bound. One more copy of the weight).
- Which kernel a call runs (`kernel(rows, dtype, packed)`, a pure function of the pass):
  * more than `FUSED_ROWS` rows (prefills, big batches; compute-bound), a call under autocast, or a grad-enabled call
    with trainable parts: the parts one by one, `F.linear` each: transformers' own arithmetic;
  * bfloat16 with a packed weight: the packed kernel, 1.35x faster for a step here. oneDNN runs
    `F.linear` too: up to `SAME_BITS_ROWS` rows the two give the same bits; beyond, `F.linear`
    switches algorithms and stops being row-invariant, while the packed kernel stays so up to
    `FUSED_ROWS` on CPUs with AMX (a verify pass's rows get the one-row step's bits;
    tests/test_projections.py checks both per shape; on an AMD EPYC without AMX the 1536-wide
    down projection's rows round otherwise among 24);
  * float32 with a packed weight (laid out for 8 rows), where that layout is row-invariant on this
    CPU for the weight's shape (`row_invariant`, probed once per shape and thread count): the
    packed kernel for every pass, one row included, so a verify pass's products give each row the
    plain step's bits (on the AVX2-only AMD EPYC measured, every shape of the built-in target, 1 to
    128 rows, and a one-row step 1.37x faster than MKL's `F.linear`: docs/cycle-cost.md). Its bits
    differ from transformers' `F.linear` by rounding (~1e-6 relative);
  * float32, one row, where that layout is not row-invariant: `F.linear` on the fused weight, the
    same bits as the parts' (MKL); several rows: the packed kernel (1.4x faster at 8 rows), which
    then rounds differently from the one-row step;
  * otherwise `F.linear` on the fused weight.
- Whatever replaces or casts the parts' tensors (`load_state_dict(assign=True)`, `.to()`,
  `.float()`) must be followed by `refresh`: `Fusing`, the mixin of the modules owning
  projections, does it in `_apply` and after every `load_state_dict`, in the module's `form`
  (`set_weights(model, form)` for every module of a model). Until the first refresh a fused call
  raises. Quantized projections take no gradients (targets are frozen).
- `weights_of(model)` -> "int8" / "int4" when its layers are quantized, else "float". `dequantized_into(model, scheme, dtype)` writes into a
  float model's layers the weights a quantized copy of it multiplies by (`quantized.dequantize` of
  each weight cast to `dtype`): the float32 reference of a quantized target (`eval.audit`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash2.errors import require
from dflash2.model import quantized

FUSED_ROWS = 128                  # passes up to this many rows (batch x tokens) run fused / packed
QUANTIZED_ROWS = 32               # quantized weights: passes up to this many rows run the quantized kernel
SAME_BITS_ROWS = 32               # bfloat16: packed and `F.linear` agree bit for bit up to here
PACKED_ROWS_HINT = {torch.bfloat16: 1, torch.float32: 8}   # oneDNN layout hint: the passes it serves
PROBE_ROWS = 5                    # float32: `row_invariant` compares passes of 2..5 rows with single rows

PARTS, FUSED, PACKED = "parts", "fused", "packed"
FORMATS = ("packed", "plain") + quantized.SCHEMES   # how a model's projections keep their weights


def kernel(rows: int, dtype: torch.dtype, packed: bool, invariant: bool = False) -> str:
    """Which kernel a pass of `rows` rows runs (see the contract); `invariant`: the packed weight
    gives each row its one-row bits (`row_invariant`)."""
    if rows > FUSED_ROWS:
        return PARTS
    if packed and (dtype == torch.bfloat16 or rows > 1 or invariant):
        return PACKED
    return FUSED


def pack(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's layout of `weight` [out, in] for passes of `PACKED_ROWS_HINT` rows (`can_pack` first)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_ROWS_HINT[weight.dtype])


def packed_product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x [.., in] times a `pack`ed weight -> [.., out]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


_INVARIANT: dict[tuple, bool] = {}     # (out, in, dtype, threads) -> what `row_invariant` found


def row_invariant(packed: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> bool:
    """Whether the packed kernel gives each of 2..`PROBE_ROWS` rows the bits it gets alone, for a
    weight of `shape` (out, in) at `dtype` with the current thread count: probed once on `packed`
    (random rows, ~0.1 s for a 49k-row LM head at float32), then remembered."""
    key = (*shape, dtype, torch.get_num_threads())
    if key not in _INVARIANT:
        x = torch.randn(PROBE_ROWS, shape[1], generator=torch.Generator().manual_seed(0)).to(dtype)
        with torch.no_grad():
            differs = rows_differ(lambda rows: packed_product(rows, packed), x, range(2, PROBE_ROWS + 1))
        _INVARIANT[key] = differs is None
    return _INVARIANT[key]


def rows_differ(op, x: torch.Tensor, counts) -> int | None:
    """The first n of `counts` for which `op(x[:n])` ([n, in] -> [n, out]) does not give each row,
    bit for bit, what `op` gives that row alone; None where every count does. x [max(counts), in]."""
    alone = torch.cat([op(x[i:i + 1]) for i in range(x.shape[0])])
    return next((n for n in counts if not torch.equal(op(x[:n]), alone[:n])), None)


def can_pack(weight: torch.Tensor) -> bool:
    """oneDNN prepacking exists for this weight: on the CPU, float32, or bfloat16 where the CPU
    computes it natively."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


class Projection:
    """Not a module: its weight is its parts' parameters (see the contract)."""

    def __init__(self, *parts: nn.Linear):
        require(all(p.bias is None for p in parts), "projections take bias-free linear layers")
        require(len({p.in_features for p in parts}) == 1, "fused projections must share their input size")
        self.parts = parts
        self.sizes = [p.out_features for p in parts]
        self.weight: torch.Tensor | None = None       # [sum(out), in]
        self.packed: torch.Tensor | None = None       # oneDNN's layout of `weight`
        self.invariant = False                        # float32: the packed kernel is row-invariant here

    def refresh(self, form: str = "packed", share: bool = True) -> None:
        """Concatenate the parts' weights, make each part's parameter a view of its rows, and keep
        the weight in `form` (`FORMATS`) besides: prepacked, or quantized. `share=False` leaves the
        parts' parameters as they are and keeps a copy instead (modules that train: their
        optimisers hold those parameters)."""
        self.packed = self.quantized = self.dequantized = None
        self.invariant = False
        if any(p.weight.is_meta for p in self.parts):
            self.weight = None                          # built on the meta device: weights come later
            return
        if len(self.parts) == 1:
            weight = self.parts[0].weight.detach()
        else:
            weight = torch.cat([p.weight.detach() for p in self.parts])
        if share and len(self.parts) > 1:
            start = 0
            for part in self.parts:
                rows = part.out_features
                part.weight = nn.Parameter(weight[start:start + rows], requires_grad=part.weight.requires_grad)
                start += rows
        self.weight = weight
        if form in quantized.SCHEMES:
            self.quantized = quantized.quantize(weight, form)
            self.dequantized = quantized.dequantize(weight, form).to(weight.dtype)     # [sum(out), in]
        elif form == "packed" and weight.dtype in PACKED_ROWS_HINT and can_pack(weight):
            self.packed = pack(weight)
            if weight.dtype == torch.float32:
                self.invariant = row_invariant(self.packed, tuple(weight.shape), weight.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.quantized is not None:                  # every pass: the model is the quantized one
            if rows <= QUANTIZED_ROWS:
                return quantized.matmul(x, self.quantized)
            return F.linear(x, self.dequantized)
        choice = kernel(rows, x.dtype, self.packed is not None, self.invariant)
        if (choice == PARTS or (torch.is_grad_enabled() and self.parts[0].weight.requires_grad)
                or torch.is_autocast_enabled(x.device.type)):   # autocast casts per op: F.linear's rule
            outs = [F.linear(x, p.weight) for p in self.parts]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        require(self.weight is not None, "fused projection used before its weights were loaded")
        if choice == PACKED:
            return packed_product(x, self.packed)
        return F.linear(x, self.weight)


class Fusing(nn.Module):
    """Mixin of modules owning `Projection`s (listed by `projections()`): they are rebuilt whenever
    the parts' tensors may have been replaced, in the module's `form` (class default "packed";
    `set_weights` for a whole model). Modules with `quantizable = False` (an LM head) keep
    "packed" when the model's layers are quantized."""

    form = "packed"
    quantizable = True

    def __init__(self) -> None:
        super().__init__()
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh_projections())

    def projections(self) -> list[Projection]:
        raise NotImplementedError

    def refresh_projections(self) -> None:
        for projection in self.projections():
            projection.refresh(self.form)

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        self.refresh_projections()
        return self


def set_weights(model: nn.Module, form: str) -> None:
    """Keep every projection of `model` in `form` (`FORMATS`): "packed" (the default: oneDNN's
    layout where that pays), "plain" (`F.linear` on the fused weight; CUDA's path everywhere),
    "int8" / "int4" (`model.quantized`; the layers only, an LM head stays "packed"). A
    quantized form is checked on every weight before any changes (one line naming the problem)."""
    require(form in FORMATS, f"projection weights must be one of {', '.join(FORMATS)}, got '{form}'")
    modules = [m for m in model.modules() if isinstance(m, Fusing)]
    if form in quantized.SCHEMES:
        for module in modules:
            for projection in module.projections() if module.quantizable else []:
                require(projection.weight is not None, "quantize a model after its weights are loaded")
                quantized.check_supported(projection.weight, form)
    for module in modules:
        module.form = form if module.quantizable or form not in quantized.SCHEMES else "packed"
        module.refresh_projections()


def weights_of(model: nn.Module) -> str:
    """The quantization scheme of `model`'s layers, or "float" (see the contract)."""
    forms = {m.form for m in model.modules() if isinstance(m, Fusing) and m.quantizable}
    scheme = forms & set(quantized.SCHEMES)
    return scheme.pop() if scheme else "float"


def dequantized_into(model: nn.Module, scheme: str, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Replace each quantizable layer's weights of `model` (any float dtype) by the ones its
    `scheme` copy at `dtype` multiplies by; the model stays in its own dtype and form."""
    require(scheme in quantized.SCHEMES, f"weight quantization must be one of {', '.join(quantized.SCHEMES)}, got '{scheme}'")
    with torch.no_grad():
        for module in model.modules():
            if not (isinstance(module, Fusing) and module.quantizable):
                continue
            for projection in module.projections():
                for part in projection.parts:
                    weight = part.weight.detach().to(dtype)
                    quantized.check_supported(weight, scheme)
                    part.weight.copy_(quantized.dequantize(weight, scheme).to(part.weight.dtype))
            module.refresh_projections()
    return model
