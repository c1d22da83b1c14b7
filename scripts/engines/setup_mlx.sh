#!/usr/bin/env bash
# MLX (CPU backend, PyPI mlx[cpu]) + mlx-lm + dflash 0.1.0 in their own venv (default .venv-mlx).
# The versions are the ones dflash 0.1.0 pins for its MLX extra (mlx 0.32.0, mlx-lm 0.31.3,
# huggingface-hub 1.27.0); that extra is declared for macOS only, so dflash goes in with --no-deps.
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=${DFLASH2_MLX_VENV:-.venv-mlx}
want="mlx[cpu]==0.32.0 mlx-lm==0.31.3 huggingface-hub==1.27.0 dflash==0.1.0"
stamp="$VENV/.dflash2-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo '*' > "$VENV/.gitignore"
PIP="nice -n 5 $VENV/bin/python -m pip"
$PIP install -q "mlx[cpu]==0.32.0" "mlx-lm==0.31.3" "huggingface-hub==1.27.0"
$PIP install -q --no-deps "dflash==0.1.0"
"$VENV/bin/python" -c "import mlx.core as mx, mlx_lm, dflash.model_mlx; print('[mlx] ok: mlx', mx.__version__, mx.default_device())" >&2
echo "$want" > "$stamp"
