#!/usr/bin/env bash
# Quick start, command 1: speculative generation on the built-in default target and draft,
# compared side by side with plain autoregressive decoding of the same target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/dflash2 generate --compare \
  --prompt "${DFLASH2_PROMPT:-Explain in three sentences why the sky is blue.}" \
  --max-new-tokens "${DFLASH2_MAX_NEW_TOKENS:-128}" "$@"
