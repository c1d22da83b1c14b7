"""Operational tooling around the library, outside the concern packages (may import any of them).

- `loadtest`: `dflash2 loadtest`, a bounded load test of `dflash2 serve` on loopback.
- `browser`: headless Chromium driving the playground (the browser test, the docs screenshot).
- `gpu/`: the remote-GPU training job (`python -m dflash2.tools.gpu.job`) and the file parts it
  travels in (`python -m dflash2.tools.gpu.parts`).
- `runners/`: out-of-process engine runner scripts (vLLM, MLX, PyPI `dflash`), run by path in their
  own virtual environments; they import nothing of dflash2.
"""
