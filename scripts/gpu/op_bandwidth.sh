#!/usr/bin/env bash
# Times the memory-bound CUDA ops at model scale (AdamW over 2e9 parameters, the xl model's
# activation kernels at batch 4 x 512 tokens) and prints the achieved GB/s (docs/gpu.md). Needs a
# build of test_ops_cuda_elementwise (scripts/gpu/build.sh test_ops_cuda_elementwise).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
"$BUILD/ctest/test_ops_cuda_elementwise" --gtest_also_run_disabled_tests --gtest_filter='Bandwidth.*' \
  | tee "${OUT:-/tmp}/op_bandwidth.log" | grep -E "^BW|^GEMM|OK|FAILED"
