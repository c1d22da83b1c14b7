#!/usr/bin/env bash
# llama.cpp from source: the copy vendored in the llama-cpp-python 0.3.36 sdist (PyPI), which has
# the DFlash / DFlash2 path (`--spec-type draft-dflash`). Builds only llama-speculative-simple, CPU,
# into .engines/llama.cpp/build (git-ignored). About 30 minutes on 2 cores; idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=.engines/llama.cpp
BIN=$SRC/build/bin/llama-speculative-simple
if [ -x "$BIN" ]; then exit 0; fi
mkdir -p .engines
echo '*' > .engines/.gitignore
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  nice -n 5 .venv/bin/python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==0.3.36" -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  rm -rf "$SRC"
  cp -r "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp "$SRC"
  rm -rf "$tmp"
fi
# no network: no prebuilt web UI download, no OpenSSL; native CPU kernels
nice -n 5 cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_APP=OFF > /dev/null
nice -n 5 cmake --build "$SRC/build" -j"$(nproc)" --target llama-speculative-simple
