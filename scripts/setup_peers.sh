#!/usr/bin/env bash
# Create the separate virtual environment that `dflash2 bench --peers` uses to run the reference
# implementation (PyPI `dflash` 0.1.0, transformers backend). Idempotent.
#
# Why a separate venv: dflash[local] pins transformers==5.15.0 while dflash2 pins 5.23.0.
# Order matters: torch==2.13.0 (the local CPU wheel) goes in FIRST, so nothing pulls a CUDA build;
# then dflash itself with --no-deps, then only the pins its model code needs (torch, transformers,
# jinja2, tqdm). `datasets` and `requests` are left out on purpose: they serve its hub-downloading
# benchmark CLI and its OpenAI client, which bench does not use (prompts come from dflash2).
# The venv writes its own .gitignore, so git never sees it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${DFLASH2_PEERS_VENV:-.venv-peers}
TORCH_VERSION=${DFLASH2_TORCH_VERSION:-2.13.0}
stamp="$VENV/.dflash2-peers-installed"
want="dflash==0.1.0 torch==$TORCH_VERSION transformers==5.15.0"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[peers] creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
echo '*' > "$VENV/.gitignore"
PIP="$VENV/bin/python -m pip"
echo "[peers] torch==$TORCH_VERSION first (CPU wheel)" >&2
$PIP install -q "torch==$TORCH_VERSION"
echo "[peers] dflash==0.1.0 without its dependencies" >&2
$PIP install -q --no-deps "dflash==0.1.0"
echo "[peers] the pins its transformers backend needs" >&2
$PIP install -q "torch==$TORCH_VERSION" "transformers==5.15.0" "jinja2==3.1.6" "tqdm==4.70.0"
$VENV/bin/python -c "import torch, transformers, dflash.model; print('[peers] ok: torch', torch.__version__, 'transformers', transformers.__version__)" >&2
echo "$want" > "$stamp"
