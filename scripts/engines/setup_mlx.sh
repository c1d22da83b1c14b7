#!/usr/bin/env bash
# MLX (CPU backend, PyPI mlx[cpu]) + mlx-lm + dflash 0.1.0 in their own venv (default .venv-mlx).
# The versions are the ones dflash 0.1.0 pins for its MLX extra (mlx 0.32.0, mlx-lm 0.31.3,
# huggingface-hub 1.27.0); that extra is declared for macOS only, so dflash goes in with --no-deps.
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/engines/venv.sh
want="mlx[cpu]==0.32.0 mlx-lm==0.31.3 huggingface-hub==1.27.0 dflash==0.1.0"
engine_venv "${DFLASH2_MLX_VENV:-.venv-mlx}" "$want"
$PIP install -q "mlx[cpu]==0.32.0" "mlx-lm==0.31.3" "huggingface-hub==1.27.0"
$PIP install -q --no-deps "dflash==0.1.0"
"$VENV/bin/python" -c "import mlx.core as mx, mlx_lm, dflash.model_mlx; print('[mlx] ok: mlx', mx.__version__, mx.default_device())" >&2
engine_done
