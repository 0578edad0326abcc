#!/usr/bin/env bash
# Session 4 call 1 (one GPU, carry .deps .device): the merged optimizers and recipes on the GPU.
#   build; gpu ctest without attention (kernels vs the CPU reference, the overlapped update with
#   AdamW and LAMB bitwise vs serial); issue 16's optimizer tests and xl step per optimizer;
#   the recipes (text, prune, cost). Each part's summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests optim recipes}
OUT=${OUT:-/tmp/s4_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$summary"
if has build; then
  scripts/device/build.sh > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  timeout 300 ctest --test-dir "$BUILD" -L gpu -E "attention|mpi|parallel" --output-on-failure > "$OUT/ctest_gpu.log" 2>&1
  note "ctest gpu (no attention, one GPU) rc=$? $(grep -aE 'tests passed|tests failed' "$OUT/ctest_gpu.log") $(grep -aE '^\s+[0-9]+ - ' "$OUT/ctest_gpu.log" | head -6 | tr '\n' ' ')"
  grep -aE "FAILED  \]|Expected|Which is" "$OUT/ctest_gpu.log" | head -8 >> "$summary"
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
if has optim; then
  OUT=$OUT/optim scripts/device/session_optim.sh tests bench > "$OUT/optim.log" 2>&1
  sed -n '/==== summary/,$p' "$OUT/optim.log" | tail -n +2 >> "$summary"
  note "optim done at $(( $(date +%s) - T0 )) s"
fi
if has recipes; then
  OUT=$OUT/recipes scripts/device/session_recipes.sh text prune cost > "$OUT/recipes.log" 2>&1
  sed -n '/==== summary/,$p' "$OUT/recipes.log" | tail -n +2 >> "$summary"
  note "recipes done at $(( $(date +%s) - T0 )) s"
fi
echo "==== summary"; cat "$summary"
