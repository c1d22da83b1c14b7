#!/usr/bin/env bash
# Prepare the target for the device machine (TRAINING.md, "GPU path"):
#
#   bash scripts/gpu/split_target.sh [--target smollm2] [--gguf FILE] [--part-mb N] [--no-wheels] [--minutes M]
#       split the built-in target's GGUF (found as dflash2.targets.builtin finds it) into git-ignored
#       parts .gpu/parts/<gguf>.part-NN with .gpu/parts/manifest.json (size and sha256 of every part
#       and of the whole), download the wheels the device lacks (gguf and the pinned transformers,
#       pip download --no-deps) into .gpu/wheels, and print the device calls that carry them
#       (.gpu/plan.md, .gpu/plan.json). Parts are sized so that each call, working tree included,
#       stays within the 64 MiB a call may send (at most 60 MB each).
#   bash scripts/gpu/split_target.sh --join PARTS_DIR DEST_FILE
#       the reverse: check every part and the whole against the manifest and join them (standard
#       library only; the training job does this itself on the device).
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = --join ]; then
  shift
  exec "$py" -m dflash2.tools.gpu.parts join "$@"
fi
exec "$py" -m dflash2.tools.gpu.parts split-target "$@"
