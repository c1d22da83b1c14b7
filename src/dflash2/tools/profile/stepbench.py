"""`python -m dflash2.tools.profile.stepbench`: the target's plain step and verify pass, timed side by side,
and where their time goes.

Contract: for each `--dtype`, the target (a built-in name or directory the built-in Llama takes)
is loaded once per projection weight form of `--forms` (`model.projections.FORMATS`: `packed`,
what ships on the CPU; `plain`, fused projections on `F.linear`, the path CUDA takes; `int8` /
`int4`, the layers' weights quantized, bfloat16 only: skipped at float32). From one prompt's KV
cache (`--context` tokens), each form runs a pass of q new tokens for each q in `--tokens` (1: the
plain step; 8: a block's verify pass) and rolls it back; the forms alternate pass by pass (A, B,
A, B, ...) `--repeats` times and the median milliseconds are reported, each form's logits
compared with the first form's (bitwise equal, or the largest difference and the share of
positions whose argmax differs). For the first form the torch profiler then splits the pass's op
time into the projections (the LM head included), attention and every other op, and counts the
aten ops a pass dispatches (nested ones included). How near the machine's limit a pass runs: the
first form's weight bytes a pass reads (`weight_bytes`: every parameter once, a tied LM head once,
an untied embedding table not at all: a lookup reads one row; unquantized forms) over its median
time, beside this machine's read bandwidth at the same threads (`read_bandwidth`: a float32 sum
over a 512 MiB buffer, median of 5; CPU only). `main` prints a markdown table; `--json` writes the
rows. On a shared machine only the ratios of the interleaved medians mean much.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from dflash2.argparsing import first_paragraph, parse_list
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.errors import DFlash2Error, require
from dflash2.files.atomic import atomic_write
from dflash2.runtime.provenance import cpu_model
from dflash2.model import projections, quantized
from dflash2.targets import builtin, llama

MATMUL_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int")
ATTENTION_OPS = ("aten::_scaled_dot_product",)


@dataclass
class PassTiming:
    dtype: str
    tokens: int
    ms: dict[str, float]              # form -> median ms of one pass
    same_logits: dict[str, bool]      # form -> its logits bit for bit the first form's
    max_logit_difference: dict[str, float]
    argmax_differs: dict[str, float]  # form -> share of positions whose top token is another
    op_ms: dict[str, float]           # first form: profiled self time of matmuls / attention / other ops
    ops_per_pass: float
    weight_gb: float = 0.0            # first form: weight bytes a pass reads, 1e9 bytes


def load_forms(target: str, dtype: torch.dtype, device: str, forms: list[str]) -> dict[str, TargetAdapter]:
    files = builtin.open_target(target)
    require(isinstance(files.config, llama.LlamaTargetConfig),
            f"target '{target}' does not load as the built-in Llama: stepbench times that implementation")
    adapters = {}
    for form in forms:
        model = builtin.load_target_model(files, device, dtype)
        projections.set_weights(model, form)
        adapters[form] = TargetAdapter(model)
    return adapters


def weight_bytes(model: torch.nn.Module) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())     # shared (tied) tensors once
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embedding.data_ptr() != head.data_ptr():
        total -= embedding.numel() * embedding.element_size()
    return total


def read_bandwidth(nbytes: int = 2**29, repeats: int = 5) -> float:
    """GB/s (1e9 bytes) a float32 sum reads at the current torch threads."""
    buffer = torch.ones(nbytes // 4, dtype=torch.float32)
    buffer.sum()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        seconds.append(time.perf_counter() - start)
    return nbytes / statistics.median(seconds) / 1e9


def _pass(adapter: TargetAdapter, ids: torch.Tensor) -> torch.Tensor:
    logits, _ = adapter.step(ids)
    adapter.keep(torch.zeros(ids.shape[0], dtype=torch.long), ids.shape[1])
    return logits


def _split(adapter: TargetAdapter, ids: torch.Tensor, passes: int = 5) -> tuple[dict[str, float], float]:
    """Profiled self time per pass of the matmuls, attention and other ops (ms), and ops per pass."""
    from torch.profiler import profile

    with profile() as prof:
        for _ in range(passes):
            _pass(adapter, ids)
    split = {"matmul": 0.0, "attention": 0.0, "other ops": 0.0}
    calls = 0
    for event in prof.key_averages():
        name = event.key
        kind = ("matmul" if name.startswith(MATMUL_OPS) else
                "attention" if name.startswith(ATTENTION_OPS) else "other ops")
        split[kind] += event.self_cpu_time_total / 1000 / passes
        calls += event.count if name.startswith(("aten::", "mkldnn::")) else 0
    return split, calls / passes


def measure(adapters: dict[str, TargetAdapter], dtype_name: str, tokens: int, context: int,
            repeats: int, device: str) -> PassTiming:
    prompt = [1000 + (i * 7919) % 40000 for i in range(context)]       # any fixed token ids
    for adapter in adapters.values():
        adapter.reset()
        adapter.prefill([prompt])
    ids = torch.randint(100, 40000, (1, tokens), generator=torch.Generator().manual_seed(tokens)).to(device)
    first = {v: _pass(a, ids) for v, a in adapters.items()}
    reference = next(iter(first.values()))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    samples: dict[str, list[float]] = {v: [] for v in adapters}
    for repeat in range(repeats):
        order = list(adapters.items()) if repeat % 2 == 0 else list(reversed(adapters.items()))
        for variant, adapter in order:
            sync()
            start = time.perf_counter()
            _pass(adapter, ids)
            sync()
            samples[variant].append(1000 * (time.perf_counter() - start))
    split, calls = _split(next(iter(adapters.values())), ids)
    return PassTiming(dtype_name, tokens, {v: statistics.median(s) for v, s in samples.items()},
                      {v: bool(torch.equal(l, reference)) for v, l in first.items()},
                      {v: (l - reference).abs().max().item() for v, l in first.items()},
                      {v: (l.argmax(-1) != reference.argmax(-1)).float().mean().item() for v, l in first.items()},
                      split, calls, weight_bytes(next(iter(adapters.values())).model) / 1e9)


def render(rows: list[PassTiming], header: str, bandwidth: float | None = None) -> str:
    """`bandwidth`: the machine's read GB/s, for the weights' share of it."""
    forms = list(dict.fromkeys(f for r in rows for f in r.ms))          # every form, in order
    columns = (["dtype", "tokens"] + [f"{f} ms" for f in forms] + [f"{f} / {forms[0]}" for f in forms[1:]]
               + ([f"logits vs {forms[0]}"] if len(forms) > 1 else [])
               + ["matmul ms", "attention ms", "other ops ms", "aten ops", "weights GB/s", "of the machine's"])
    lines = [header, "", "| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    for r in rows:
        ratios = [f"{r.ms[f] / r.ms[forms[0]]:.2f}" if f in r.ms else "-" for f in forms[1:]]
        same = [", ".join(f"{f}: " + ("same" if r.same_logits[f] else f"{r.max_logit_difference[f]:.1e}, "
                                      f"top token differs at {100 * r.argmax_differs[f]:.0f} %")
                          for f in forms[1:] if f in r.ms)] if len(forms) > 1 else []
        cells = ([r.dtype, str(r.tokens)] + [f"{r.ms[f]:.1f}" if f in r.ms else "-" for f in forms] + ratios + same
                 + [f"{r.op_ms['matmul']:.1f}", f"{r.op_ms['attention']:.1f}", f"{r.op_ms['other ops']:.1f}",
                    f"{r.ops_per_pass:.0f}", _rate(r, forms[0]), _share(r, forms[0], bandwidth)])
        lines.append("| " + " | ".join(cells) + " |")
    if bandwidth is not None:
        lines += ["", f"This machine reads {bandwidth:.1f} GB/s at these threads (a float32 sum over 512 MiB); "
                      f"a pass cannot beat its weight bytes at that rate."]
    return "\n".join(lines)


def _gb_per_s(row: PassTiming, form: str) -> float | None:
    """The weights a pass of `form` reads per second (None: a quantized form, whose bytes are others)."""
    return row.weight_gb / (row.ms[form] / 1000) if row.weight_gb and form not in quantized.SCHEMES else None


def _rate(row: PassTiming, form: str) -> str:
    rate = _gb_per_s(row, form)
    return "-" if rate is None else f"{rate:.1f}"


def _share(row: PassTiming, form: str, bandwidth: float | None) -> str:
    rate = _gb_per_s(row, form)
    return "-" if rate is None or bandwidth is None else f"{100 * rate / bandwidth:.0f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash2.tools.profile.stepbench", description=first_paragraph(__doc__))
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma list: float32, bfloat16")
    parser.add_argument("--forms", default="packed,plain", help="comma list of projection weight forms: "
                        "packed, plain, int8, int4 (quantized forms at bfloat16 only); the first is the reference")
    parser.add_argument("--tokens", default="1,8", help="comma list of pass sizes (new tokens per pass)")
    parser.add_argument("--context", type=int, default=300, help="tokens in the cache before each pass")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    try:
        args = parser.parse_args(argv)
        dtypes = parse_list(args.dtype, "--dtype")
        require(all(d in ("float32", "bfloat16") for d in dtypes), f"--dtype takes float32 and bfloat16, got '{args.dtype}'")
        tokens = parse_list(args.tokens, "--tokens")
        require(all(t.isdigit() and 0 < int(t) <= 64 for t in tokens), f"--tokens must be integers 1..64, got '{args.tokens}'")
        require(args.repeats > 0 and args.context > 0, "--repeats and --context must be positive")
        forms = parse_list(args.forms, "--forms")
        require(all(f in projections.FORMATS for f in forms),
                f"--forms takes {', '.join(projections.FORMATS)}, got '{args.forms}'")
        require(args.threads is None or args.threads > 0, f"--threads must be positive, got {args.threads}")
        if args.threads:
            torch.set_num_threads(args.threads)
        rows = []
        for dtype in dtypes:
            usable = [f for f in forms if dtype == "bfloat16" or f not in quantized.SCHEMES]
            if not usable:
                continue
            adapters = load_forms(args.target, getattr(torch, dtype), args.device, usable)
            rows += [measure(adapters, dtype, int(t), args.context, args.repeats, args.device) for t in tokens]
    except DFlash2Error as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    header = (f"Target pass timings: {args.target} on {args.device} ({cpu_model()}, {torch.get_num_threads()} threads), "
              f"{args.context} cached tokens, median of {args.repeats} interleaved passes")
    bandwidth = read_bandwidth() if args.device == "cpu" else None
    print(render(rows, header, bandwidth))
    if args.json:
        with atomic_write(args.json, "w") as handle:
            json.dump([asdict(r) for r in rows], handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
