"""Can torch.compile make the target's plain step cheaper? Two measurements, in one process.

Usage: PYTHONPATH=src python scripts/compiled_target_ab.py [--rounds 100] [--threads 2] [--rows 1]
       [--whole-step] [--tokens 64]

The default target (SmolLM2-135M) at bfloat16, loaded as `dflash2 generate` loads it.
- Part 1, the layers' matmuls: the chain a decoding pass runs through its 30 layers' projections
  (QKV, O, gate-up, down; an RMS rescale after each layer keeps the values finite; no attention,
  no LM head) on `--rows` rows, in three forms, rounds interleaved, medians of wall time:
  `packed` (the shipped form: oneDNN's prepacked weights, `model.projections`), `F.linear` (the
  same weights unpacked), and `compiled` (the `F.linear` chain through `torch.compile` with
  inductor's `freezing`, which folds the weights in and packs them itself, and `cpp_wrapper`). The
  weights' bytes over the median give each form's read rate.
- Part 2 (`--whole-step`): the whole model's forward compiled (`dynamic=True`, the weights unpacked
  and frozen) inside real plain decoding of one chat prompt (`--tokens` tokens, T=0, batch 1):
  tokens per second against the shipped eager model, compile time, and whether the answer is the
  same.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from dflash2.decoding.loop.requests import GenerationConfig
from dflash2.model.projections import set_weights
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_prompt

PROMPT = "Explain in three sentences why the sky is blue."


def _rescaled(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)


class LayerMatmuls(nn.Module):
    """The projections of every layer as one chain over their weights (copies, unpacked)."""

    def __init__(self, layers: nn.ModuleList):
        super().__init__()
        self.weights = nn.ParameterList(
            nn.Parameter(p.weight.detach().clone(), requires_grad=False)
            for layer in layers
            for p in (layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up, layer.mlp.down))
        self.hidden = layers[0].self_attn.out.weight.shape[1]
        self.intermediate = layers[0].mlp.down.weight.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(0, len(self.weights), 4):
            qkv, out, gate_up, down = self.weights[i:i + 4]
            x = x + F.linear(F.linear(x, qkv)[..., :self.hidden], out)
            g = F.linear(x, gate_up)                                   # [.., 2 * intermediate]
            x = _rescaled(x + F.linear(F.silu(g[..., :self.intermediate]) * g[..., self.intermediate:], down))
        return x


def packed_chain(layers: nn.ModuleList, hidden: int, intermediate: int):
    """The same chain on the shipped model's own projections (`Projection.__call__`: packed)."""
    def run(x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            x = x + layer.self_attn.out(layer.self_attn.qkv(x)[..., :hidden].contiguous())
            g = layer.mlp.gate_up(x)
            x = _rescaled(x + layer.mlp.down((F.silu(g[..., :intermediate]) * g[..., intermediate:]).contiguous()))
        return x
    return run


def part1(model, rounds: int, rows: int) -> None:
    import torch._inductor.config as inductor
    inductor.freezing, inductor.cpp_wrapper = True, True
    layers = model.model.layers
    chain = LayerMatmuls(layers).eval()
    forms = {"packed (shipped)": packed_chain(layers, chain.hidden, chain.intermediate), "F.linear": chain}
    x = torch.randn(1, rows, chain.hidden, dtype=torch.bfloat16)
    with torch.no_grad():
        started = time.perf_counter()
        forms["compiled"] = torch.compile(chain)
        forms["compiled"](x)
        print(f"compiling the chain: {time.perf_counter() - started:.1f} s")
        reference = forms["packed (shipped)"](x).float()
        samples = {name: [] for name in forms}
        for r in range(rounds):
            for name, fn in (list(forms.items()) if r % 2 else list(forms.items())[::-1]):
                t = time.perf_counter()
                fn(x)
                samples[name].append(time.perf_counter() - t)
        nbytes = sum(w.numel() * w.element_size() for w in chain.weights)
        threads = torch.get_num_threads()
        print(f"\n## the layers' matmuls, bfloat16, {rows} row(s), {threads} thread(s), {rounds} rounds\n")
        print("| form | ms (median) | GB/s | largest difference from packed |\n|---|---:|---:|---:|")
        for name, fn in forms.items():
            ms = statistics.median(samples[name])
            diff = (fn(x).float() - reference).abs().max().item()
            print(f"| {name} | {1000 * ms:.2f} | {nbytes / ms / 1e9:.1f} | {diff:.3g} |")


def part2(pipe, tokens: int) -> None:
    decoder, model = pipe.decoder, pipe.decoder.target.model
    ids = encode_prompt(pipe.tokenizer, PROMPT)
    config = GenerationConfig(max_new_tokens=tokens)

    def decode() -> tuple[float, list[int]]:
        times, out = [], None
        for _ in range(3):
            t = time.perf_counter()
            out = decoder.generate([ids], config)[0].tokens
            times.append(time.perf_counter() - t)
        return statistics.median(times), out

    decoder.generate([ids], config)
    eager_s, eager_out = decode()
    import torch._dynamo
    import torch._inductor.config as inductor
    inductor.freezing, inductor.cpp_wrapper = True, False
    torch._dynamo.config.cache_size_limit = 64
    set_weights(model, "plain")                 # inductor cannot trace oneDNN's packed tensors
    model.forward = torch.compile(model.forward, dynamic=True)
    started = time.perf_counter()
    decoder.generate([ids], config)
    compile_s = time.perf_counter() - started
    compiled_s, compiled_out = decode()
    print(f"\n## the whole forward compiled, plain decoding, {tokens} tokens, T=0, batch 1\n")
    print(f"| form | tok/s |\n|---|---:|\n| eager (shipped) | {tokens / eager_s:.1f} |\n"
          f"| compiled | {tokens / compiled_s:.1f} |")
    print(f"\ncompiling: {compile_s:.0f} s; the same answer: {compiled_out == eager_out}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--whole-step", action="store_true")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pipe = load_decoder("smollm2", dtype="bfloat16", no_draft=True)
    part1(pipe.decoder.target.model, args.rounds, args.rows)
    if args.whole_step:
        part2(pipe, args.tokens)


if __name__ == "__main__":
    main()
