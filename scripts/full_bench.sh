#!/usr/bin/env bash
# The full evaluation protocol (SPEC §5; issues 22 and 24) for the shipped draft on the default
# target: the 5 benchmark sets and the project's input-grounded set, 20 prompts x 256 new tokens,
# the three proposers side by side in one run against one autoregressive baseline (the draft alone,
# lookup alone, hybrid: --proposer draft,lookup,hybrid), at the default precision (--dtype auto:
# bfloat16 on CPUs with avx512_bf16 / AMX and on CUDA), T=0 at concurrency 1/8/32 with the peers
# (HF generate, HF prompt lookup, PyPI dflash 0.1.0; llama.cpp plain and with the exported draft,
# batch 1, where llama.cpp is installed: $DFLASH2_LLAMA_CPP or `bash scripts/engines/install_llama_cpp.sh`,
# else the two are recorded as unavailable), and the official T=1 (top-p 0.95, top-k 20) at
# concurrency 1/8 with the Hugging Face peers.
#
# Hours of CPU on a 2-core machine, so it is resumable: every finished dataset and peer group is
# saved under docs/bench/full-t{0,1}/parts/ (the float32 run of commit 2c52bbf is kept in
# docs/bench/full-fp32-t{0,1}), and rerunning this script continues where it stopped,
# as long as the draft weights, the dflash2 source and the kind of machine are the same (the parts'
# fingerprint holds all three; a part from anything else is recomputed, never mixed in). To keep
# the source fixed while main moves on, run it from a worktree of one commit:
#   git worktree add /tmp/fb COMMIT && cd /tmp/fb && bash scripts/full_bench.sh t0
# Commit the parts before a machine goes away. Usage: bash scripts/full_bench.sh [t0|t1|all] [bench args]
# (extra arguments go to both `dflash2 bench` runs, e.g. --threads 1 beside a training job).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
[ -x .venv-peers/bin/python ] || bash scripts/setup_peers.sh
export HF_HUB_OFFLINE=1
which="${1:-all}"
shift || true
common=(--datasets gsm8k,math500,humaneval,mbpp,mt-bench --dataset-file src/dflash2/data/benchmarks/grounded.jsonl
        --num-prompts 20 --max-new-tokens 256 --resume --proposer draft,lookup,hybrid)
if [ "$which" = t0 ] || [ "$which" = all ]; then
  .venv/bin/dflash2 bench "${common[@]}" --temperature 0 --concurrency 1,8,32 --peers hf,pld,dflash,llama-cpp,llama-cpp-dflash \
    --output docs/bench/full-t0 "$@"
fi
if [ "$which" = t1 ] || [ "$which" = all ]; then
  .venv/bin/dflash2 bench "${common[@]}" --temperature 1 --top-p 0.95 --top-k 20 --concurrency 1,8 --peers hf,pld \
    --output docs/bench/full-t1 "$@"
fi
