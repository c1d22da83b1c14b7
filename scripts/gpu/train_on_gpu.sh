#!/usr/bin/env bash
# The GPU training path (TRAINING.md, "GPU path"), as the device machine runs it from the repository:
#
#   bash scripts/gpu/train_on_gpu.sh OUT_DIR [MINUTES] [--cpu] [gpu_job options] [section.key=value ...]
#       join + verify the GGUF parts (.gpu/parts), convert the target, read data/regen/*, cache the
#       features, train configs/smollm2-dflash2-gpu.yaml inside MINUTES (default 9) of wall-clock time
#       from this script's start, and write the draft into OUT_DIR in parts of <= 15 MiB + manifest,
#       metrics.jsonl, summary.json, curves.png. Run it again to continue an unfinished run.
#   bash scripts/gpu/train_on_gpu.sh --smoke OUT_DIR [--cpu]   tiny random target: train, pack, unpack,
#       lossless check (the first device call: seconds, before the parts are all there)
#   bash scripts/gpu/train_on_gpu.sh --check                   packages, CUDA, which parts have arrived
#
# Wheels in .gpu/wheels (gguf, the pinned transformers: scripts/gpu/split_target.sh) are installed once
# into .gpu/site, first on PYTHONPATH, unless this Python has those versions already; src/ is on
# PYTHONPATH too (dflash2 is not installed there). PYTHON defaults to .venv/bin/python where it exists,
# else python3. Without --cpu the job refuses to run without CUDA. Work files (target, features, run)
# stay in .gpu/work between calls. Exit status: 0 done (or stopped in budget, draft exported),
# 2 bad input (one line says what), 3 features not complete yet (run it again).
set -uo pipefail
export DFLASH2_GPU_T0="$(date +%s.%N)"
cd "$(dirname "$0")/../.."
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G ".gpu/wheels/*.whl" > /dev/null; then
  site="$PWD/.gpu/site"
  stamp="$site/.installed-$(ls .gpu/wheels/*.whl | xargs -n1 basename | sort | sha256sum | cut -c1-16)"
  have=$("$py" - .gpu/wheels/*.whl <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None
wheels = [w.rsplit("/", 1)[-1].split("-")[:2] for w in sys.argv[1:]]
print("yes" if all(installed(name) == ver for name, ver in wheels) else "no")
PY
)
  if [ "$have" != yes ] && [ ! -f "$stamp" ]; then
    rm -rf "$site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .gpu/wheels/*.whl \
      || { echo "error: pip could not install the wheels of .gpu/wheels into $site" >&2; exit 2; }
    touch "$stamp"
  fi
  [ "$have" != yes ] && export PYTHONPATH="$site:$PYTHONPATH"
fi

cuda=--require-cuda
args=()
for arg in "$@"; do
  if [ "$arg" = --cpu ]; then cuda=""; else args+=("$arg"); fi
done
set -- "${args[@]+"${args[@]}"}"
command -v nvidia-smi > /dev/null && nvidia-smi -L

case "${1:-}" in
  --check)
    shift; exec "$py" -m dflash2.tools.gpu.job check $cuda "$@" ;;
  --smoke)
    [ $# -ge 2 ] || { echo "usage: train_on_gpu.sh --smoke OUT_DIR [--cpu]" >&2; exit 2; }
    out="$2"; shift 2
    exec "$py" -m dflash2.tools.gpu.job smoke "$out" $cuda "$@" ;;
  "" | -h | --help)
    sed -n '2,21p' "$0"; exit 2 ;;
  *)
    out="$1"; shift
    minutes=9
    if [[ "${1:-}" =~ ^[0-9]+([.][0-9]+)?$ ]]; then minutes="$1"; shift; fi
    [ -n "$cuda" ] || set -- "$@" train.device=cpu
    exec "$py" -m dflash2.tools.gpu.job train "$out" --minutes "$minutes" $cuda "$@" ;;
esac
