"""Operational tooling around the library, outside the concern packages (may import any of them).

- `loadtest`: `dflash2 loadtest`, a bounded load test of `dflash2 serve` on loopback (`loadprobe`:
  its probe).
- `browser`: headless Chromium driving the playground (the browser test, the docs screenshot).
- `gpu/`: the remote-GPU training job (`python -m dflash2.tools.gpu.job`) and the file parts it
  travels in (`python -m dflash2.tools.gpu.parts`).
- `profile/`: profiling tools (`cycles`, `microbench`, `rollback`).
The out-of-process engine runners (vLLM, MLX, PyPI `dflash`) are not part of the package: they run
in their own virtual environments from scripts/engines/runners/.
"""
