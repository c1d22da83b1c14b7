#!/bin/bash
# BENCHMARKS.md §7.1 and docs/cycle-cost.md (a cycle's phases by batch size): the cycle profile and always-vs-auto benches of one code version.
# usage: scripts/never_slower.sh OUT [DRAFT ...]   (default drafts: the shipped one)
# Run it from the checkout to measure (for "before", from a worktree of the older commit), with
# nothing else running: it times things. `auto` runs decode the prompts REPEATS times (default 3,
# both decoders in turn per batch) for the median of paired ratios; batch 32 is also run alone in
# a fresh process (the policy meets its first batch at 32, not after learning at 1 and 8).
set -euo pipefail
out=$1; shift
drafts=("${@:-src/dflash2/checkpoints/smollm2-dflash2}")
py=${PYTHON:-.venv/bin/python}
repeats=${REPEATS:-3}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/src"
common=(--threads 2 --datasets gsm8k --num-prompts 32 --max-new-tokens 32 --proposer draft)
$py -m dflash2.tools.profile.cycles --threads 2 --batch 1,8,32 --new-tokens 32 --json "$out/cycles.json" > "$out/cycles.md"
for draft in "${drafts[@]}"; do
  name=$(basename "$draft")
  $py -m dflash2.cli bench "${common[@]}" --concurrency 1,8,32 --draft "$draft" --speculate always \
    --output "$out/bench-$name-always"
  $py -m dflash2.cli bench "${common[@]}" --concurrency 1,8,32 --repeats "$repeats" --draft "$draft" \
    --speculate auto --output "$out/bench-$name-auto"
  $py -m dflash2.cli bench "${common[@]}" --concurrency 32 --repeats "$repeats" --draft "$draft" \
    --speculate auto --output "$out/bench-$name-auto-c32"
done
