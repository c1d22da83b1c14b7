"""The one-row float32 products of a SmolLM2-135M step (30 layers' Q/K/V, O, gate/up and down
weights, then the 49,152-row LM head), timed per kernel: what the plain step's matmuls could cost.

    python scripts/onerow_kernels.py [--threads 2] [--repeats 11] [--rows 1]

Random weights of the target's shapes (one copy per layer, so the pass streams them from memory as
a real step does). Kernels, interleaved pass by pass, medians: `F.linear` (MKL: what the plain step
runs at float32), oneDNN's prepacked weight (`mkldnn._linear_pointwise`, the verify pass's kernel;
layout hint 1 and 8), and `x @ W^T` with W^T stored [in, out]. Prints ms per pass, the weight bytes
it read per second, the machine's read bandwidth (a float32 sum over 512 MiB), whether each kernel
gives `F.linear`'s bits, and whether it is row-invariant: each row of a `--rows`-row product (when
`--rows` > 1) has the bits that row gets alone, as a verify pass's rows would need to match the plain
step's. Not part of the test run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))   # (out, in): qkv, o, gate_up, down
HEAD, LAYERS = (49152, 576), 30


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--rows", type=int, default=1, help="rows per product (1: the plain step)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [torch.randn(o, i) * 0.02 for _ in range(LAYERS) for (o, i) in SHAPES] + [torch.randn(*HEAD) * 0.02]
    inputs = {i: torch.randn(args.rows, i) for i in {w.shape[1] for w in weights}}
    packed = {hint: [torch.ops.mkldnn._reorder_linear_weight(w, hint) for w in weights] for hint in (1, 8)}
    transposed = [w.t().contiguous() for w in weights]                       # [in, out]

    def linear(w):
        return F.linear(inputs[w.shape[1]], w)

    def onednn(hint):
        return lambda i: torch.ops.mkldnn._linear_pointwise(inputs[weights[i].shape[1]], packed[hint][i], None, "none", [], "")

    kernels = {
        "F.linear (MKL)": lambda i: linear(weights[i]),
        "oneDNN packed, hint 1": onednn(1),
        "oneDNN packed, hint 8": onednn(8),
        "x @ W^T stored [in, out]": lambda i: inputs[transposed[i].shape[0]] @ transposed[i],
    }
    times = {name: [] for name in kernels}
    for _ in range(args.repeats + 1):                                        # the first round warms up
        for name, kernel in kernels.items():
            start = time.perf_counter()
            for i in range(len(weights)):
                kernel(i)
            times[name].append(time.perf_counter() - start)
    gigabytes = sum(w.numel() for w in weights) * 4 / 1e9
    reference = [linear(w) for w in weights]
    print(f"{args.rows}-row float32 products of a SmolLM2-135M pass ({gigabytes:.2f} GB of weights), {args.threads} threads")
    full = {size: x.clone() for size, x in inputs.items()}   # the --rows-row inputs
    for name, kernel in kernels.items():
        ms = statistics.median(times[name][1:]) * 1e3
        same = all(torch.equal(kernel(i), reference[i]) for i in range(len(weights)))
        line = f"  {name:26s} {ms:7.1f} ms  {gigabytes / ms * 1e3:5.1f} GB/s  F.linear's bits: {same}"
        if args.rows > 1:
            together = [kernel(i) for i in range(len(weights))]
            alone = []
            for r in range(args.rows):                       # each row as a one-row product
                for size in full:
                    inputs[size] = full[size][r:r + 1]
                alone.append([kernel(i) for i in range(len(weights))])
            inputs.update(full)
            invariant = all(torch.equal(together[i][r], alone[r][i][0])
                            for i in range(len(weights)) for r in range(args.rows))
            line += f"  row-invariant: {invariant}"
        print(line)
    buffer = torch.ones(512 * 2**20 // 4)
    reads = []
    for _ in range(5):
        start = time.perf_counter()
        buffer.sum()
        reads.append(time.perf_counter() - start)
    print(f"  this machine reads {buffer.numel() * 4 / 1e9 / statistics.median(reads):.1f} GB/s (a float32 sum over 512 MiB)")


if __name__ == "__main__":
    main()
