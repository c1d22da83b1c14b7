#!/usr/bin/env bash
# One short CUDA check of dflash2 (minutes on one GPU; never part of CI, which has no GPU).
#
#   bash scripts/gpu_check.sh [OUT_DIR] [TARGET]      (OUT_DIR default runs/gpu_check, TARGET smollm2)
#
# 1. The lossless tests on CUDA: greedy equality (fp32) and sampling exactness (chi-square), with the
#    tiny models of the test suite moved to the GPU (DFLASH2_TEST_DEVICE=cuda).
# 2. `dflash2 bench` on CUDA, fp32, with the shipped draft: 2 datasets x 4 prompts x 32 tokens at
#    concurrency 1 and 8, HF generate and prompt lookup beside it; results.json holds the lossless
#    mismatch counts on this GPU.
# 3. `python -m dflash2.tools.profile.microbench` on CUDA with the target in float32 and in bfloat16: target
#    forward of 1 vs 8 tokens, draft, selector, convs, engine vs HF generate tokens/s.
# 4. The training tests (their device is `auto`, i.e. CUDA here; the 2-process gloo DDP test is CPU
#    only and left out). Extra pytest options (e.g. a --deselect) go in PYTEST_ADDOPTS.
# 5. `dflash2 analyze` on CUDA, 2 prompts x 32 tokens (that it runs; not its numbers).
#
# TARGET is any target name or directory `dflash2 generate` takes. PYTHON (default .venv/bin/python,
# else python3) must have dflash2 importable. Each step's exit status goes to OUT_DIR/summary.txt;
# the script goes on after a failing step and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu_check}"
target="${2:-smollm2}"
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
draft="src/dflash2/checkpoints/smollm2-dflash2"
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
failed=0

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/NAME.log, record the status
  local name="$1" limit="$2"; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%-14s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$(tr '\r' '\n' < "$out/$name.log" | grep -v '^ *$' | tail -n 1 | cut -c1-120)" \
    | tee -a "$out/summary.txt"
  [ "$rc" = 0 ] || failed=1
}

: > "$out/summary.txt"
{ nvidia-smi -L; "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'| transformers', transformers.__version__, '|', torch.cuda.get_device_name(0))"; } | tee -a "$out/summary.txt"

step lossless 300 env DFLASH2_TEST_DEVICE=cuda "$py" -m pytest -p no:cacheprovider -q \
  tests/test_lossless_greedy.py tests/test_lossless_sampling.py
step bench 240 "$py" -m dflash2.cli bench --target "$target" --draft "$draft" --device cuda --dtype float32 \
  --datasets gsm8k,mt-bench --num-prompts 4 --max-new-tokens 32 --concurrency 1,8 --peers hf,pld \
  --output "$out/bench"
for dtype in float32 bfloat16; do
  step "micro-$dtype" 180 "$py" -m dflash2.tools.profile.microbench --target "$target" --draft "$draft" --device cuda \
    --dtype "$dtype" --json "$out/microbench-$dtype.json"
done
step training 240 "$py" -m pytest -p no:cacheprovider -q $(ls tests/test_training_*.py | grep -v _ddp)
step analyze 180 "$py" -m dflash2.cli analyze --target "$target" --draft "$draft" --device cuda --dtype float32 \
  --dataset gsm8k --num-prompts 2 --max-new-tokens 32 --repeats 3 --output "$out/analyze"
exit "$failed"
