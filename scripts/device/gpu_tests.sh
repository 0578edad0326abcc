#!/usr/bin/env bash
# On the GPU machine: builds everything (scripts/device/build.sh) and runs the gpu-labelled tests.
# Every GPU issue uses this, in one device call that carries `.deps` (docs/gpu.md):
#   scripts/device/gpu_tests.sh                 # build all, ctest -L gpu
#   CTEST_ARGS='-R ops_cuda' scripts/device/gpu_tests.sh
# Logs go to $OUT (when the device tool sets it) so they come back even if the call times out.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
BUILD=${BUILD:-build-device}
export BUILD
LOG=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
start=$(date +%s)
if ! scripts/device/build.sh > "$LOG/build.log" 2>&1; then
  echo "build failed:"
  grep -E "error|FAILED" "$LOG/build.log" | head -40
  tail -20 "$LOG/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
# shellcheck disable=SC2086
ctest --test-dir "$BUILD" -L gpu --output-on-failure ${CTEST_ARGS:-} 2>&1 | tee "$LOG/ctest_gpu.log"
