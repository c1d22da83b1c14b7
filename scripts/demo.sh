#!/usr/bin/env bash
# Quick start, command 1: speculative generation on the built-in default target and draft,
# compared side by side with plain autoregressive decoding of the same target: first a chat
# prompt of the project's `fresh` set (its answer does not repeat itself, so lookup has little to
# copy and the draft must earn the speedup), then an input-grounded one (a given text to edit),
# where lookup proposals (the tokens that followed the latest ones earlier in the prompt) verify
# beside the draft's (the default --proposer hybrid).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
export HF_HUB_OFFLINE=1
.venv/bin/dflash2 generate --compare \
  --prompt "${DFLASH2_PROMPT:-How should I prepare for a job interview at a small company?}" \
  --max-new-tokens "${DFLASH2_MAX_NEW_TOKENS:-128}" "$@"
echo
exec .venv/bin/dflash2 generate --compare \
  --prompt "${DFLASH2_GROUNDED_PROMPT:-Correct the spelling in this text and return it whole: The quarterly reveiw meeting has moved from Thursday to Friday at 10:00 in room 4B. Please bring the updated sales figures for the northern region and the draft budget for next year. Lunch will be provided after the meeting.}" \
  --max-new-tokens "${DFLASH2_MAX_NEW_TOKENS:-128}" "$@"
