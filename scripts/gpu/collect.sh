#!/usr/bin/env bash
# Rebuild the draft a device call gave back (TRAINING.md, "GPU path"):
#
#   bash scripts/gpu/collect.sh PARTS_DIR DEST [--force]
#
# PARTS_DIR holds draft.tar.part-NN and manifest.json (the reply's files_at). Every part and the
# whole are checked against the manifest's sha256, the files are extracted into DEST (it appears
# whole; an existing non-empty DEST needs --force) and checked again, and the draft must load with
# DFlash2DraftModel.from_pretrained. Prints one JSON line (files, parameters, layers).
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
exec "$py" -m dflash2.tools.gpu.parts collect "$@"
