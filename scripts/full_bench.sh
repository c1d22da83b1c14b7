#!/usr/bin/env bash
# The full evaluation protocol of issue 4 / SPEC §5 for the shipped draft on the default target:
# 5 datasets x 20 prompts x 256 new tokens, T=0 at concurrency 1/8/32 and the official T=1
# (top-p 0.95, top-k 20) at concurrency 1, each with the peers (HF generate, HF prompt lookup,
# PyPI dflash 0.1.0) in the same run.
#
# Hours of CPU on a 2-core machine, so it is resumable: every finished dataset and peer group is
# saved under docs/bench/full-t{0,1}/parts/ and rerunning this script continues where it stopped,
# as long as the draft weights, the dflash2 source and the kind of machine are the same (the parts'
# fingerprint holds all three; a part from anything else is recomputed, never mixed in).
# Commit the parts before a machine goes away. Usage: bash scripts/full_bench.sh [t0|t1|all]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
[ -x .venv-peers/bin/python ] || bash scripts/setup_peers.sh
export HF_HUB_OFFLINE=1
which="${1:-all}"
common=(--datasets gsm8k,math500,humaneval,mbpp,mt-bench --num-prompts 20 --max-new-tokens 256 --peers --resume --proposer draft)
if [ "$which" = t0 ] || [ "$which" = all ]; then
  .venv/bin/dflash2 bench "${common[@]}" --temperature 0 --concurrency 1,8,32 --output docs/bench/full-t0
fi
if [ "$which" = t1 ] || [ "$which" = all ]; then
  .venv/bin/dflash2 bench "${common[@]}" --temperature 1 --top-p 0.95 --top-k 20 --concurrency 1 \
    --output docs/bench/full-t1
fi
