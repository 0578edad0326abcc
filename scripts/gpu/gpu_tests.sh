#!/usr/bin/env bash
# Builds everything with CUDA (scripts/gpu/build.sh) and runs the gpu-labelled tests (docs/gpu.md).
#   scripts/gpu/gpu_tests.sh                        # ctest -L gpu
#   CTEST_ARGS='-R ops_cuda' scripts/gpu/gpu_tests.sh
# Logs go to $OUT (default /tmp): build.log, ctest_gpu.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
LOG=${OUT:-/tmp}
mkdir -p "$LOG"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
start=$(date +%s)
if ! scripts/gpu/build.sh > "$LOG/build.log" 2>&1; then
  echo "build failed:"
  grep -E "error|FAILED" "$LOG/build.log" | head -40
  tail -20 "$LOG/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
# shellcheck disable=SC2086
ctest --test-dir "$BUILD" -L gpu --output-on-failure ${CTEST_ARGS:-} 2>&1 | tee "$LOG/ctest_gpu.log"
