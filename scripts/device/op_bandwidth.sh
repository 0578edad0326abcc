#!/usr/bin/env bash
# On the GPU machine: times the memory-bound CUDA ops at model scale (AdamW over 2e9 parameters,
# the xl model's activation kernels at batch 4 x 512 tokens) and prints achieved GB/s. Needs a
# build (scripts/device/build.sh test_ops_cuda_elementwise, or BUILD pointing at one).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
BUILD=${BUILD:-build-device}
"$BUILD/ctest/test_ops_cuda_elementwise" --gtest_also_run_disabled_tests --gtest_filter='Bandwidth.*' \
  | tee "${OUT:-/tmp}/op_bandwidth.log" | grep -E "^BW|^GEMM|OK|FAILED"
