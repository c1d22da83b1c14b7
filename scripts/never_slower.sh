#!/bin/bash
# BENCHMARKS.md §7: the cycle profile and always-vs-auto benches of one code version.
# usage: scripts/never_slower.sh OUT [DRAFT ...]   (default drafts: the shipped one)
# Run it from the checkout to measure (for "before", from a worktree of the older commit), with
# nothing else running: it times things.
set -euo pipefail
out=$1; shift
drafts=("${@:-src/dflash2/checkpoints/smollm2-dflash2}")
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/src"
$py -m dflash2.eval.cycles --threads 2 --batch 1,8,32 --new-tokens 32 --json "$out/cycles.json" > "$out/cycles.md"
for draft in "${drafts[@]}"; do
  for mode in always auto; do
    $py -m dflash2.cli bench --threads 2 --datasets gsm8k --num-prompts 32 --max-new-tokens 32 \
      --concurrency 1,8,32 --draft "$draft" --speculate "$mode" --output "$out/bench-$(basename "$draft")-$mode"
  done
done
