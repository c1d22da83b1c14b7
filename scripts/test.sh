#!/usr/bin/env bash
# Quick start, command 2: the test suite (CPU, no network).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
