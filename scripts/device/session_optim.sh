#!/usr/bin/env bash
# Issue 16 (optimizers) on the GPU machine. Carry [".deps", ".device"] as for the other sessions.
#   scripts/device/session_optim.sh [stages...]        (default: build tests bench)
#   build   build everything on the device
#   tests   gpu.test_optimizer_steps_cuda (momentum, LAMB moments/update, trust-ratio norms, whole
#           SGD/LARS/LAMB steps vs the fp64 CPU reference; 1 GPU), the AdamW kernel test (unchanged),
#           and with 2 GPUs (kind nvidia-h200-x2) DataParallelGpu.OptimizersMatchOneGpuInBf16:
#           sgd/lars/lamb under zero1, zero2, fsdp and tp 2 vs one GPU in bf16 over NCCL
#   bench   optimizer step time of xl bf16 on one GPU for adamw, sgd, lars, lamb (bench-model
#           train-step, the `optimizer` phase), for docs/performance.md
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests bench}
OUT=${OUT:-/tmp/session_optim_out}
source scripts/device/session_lib.sh

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if has build; then
  scripts/device/build.sh > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  timeout 300 "$BUILD/ctest/test_optimizer_steps_cuda" > "$OUT/test_optimizer_steps_cuda.log" 2>&1
  note "optimizer kernels vs CPU: rc=$? $(grep -aE '^\[  (PASSED|FAILED)|Expected|error|relative' "$OUT/test_optimizer_steps_cuda.log" | head -8 | tr '\n' ' ')"
  timeout 300 "$BUILD/ctest/test_ops_cuda_elementwise" --gtest_filter='*AdamW*' > "$OUT/test_adamw_cuda.log" 2>&1
  note "adamw kernel: rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/test_adamw_cuda.log" | tr '\n' ' ')"
  if [ "$gpus" -ge 2 ]; then
    timeout 400 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/parallel/mpi_test_parallel_gpu" \
      --gtest_filter='DataParallelGpu.OptimizersMatchOneGpuInBf16' > "$OUT/test_optim_2gpu.log" 2>&1
    note "optimizers on 2 GPUs (zero1, zero2, fsdp, tp2) vs 1 GPU: rc=$? $(grep -aE '^\[  (PASSED|FAILED)|Expected|actual|Which is' "$OUT/test_optim_2gpu.log" | head -10 | tr '\n' ' ')"
  else
    note "1 GPU: the 2-GPU optimizer test needs kind nvidia-h200-x2"
  fi
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
if has bench; then
  for o in adamw sgd lars lamb; do
    CUDA_VISIBLE_DEVICES=0 timeout 150 $LM inputs/bench_model_xl_bf16.ini --optim.name=$o --bench.mode=train-step \
      --run.output="$OUT/optim_xl_$o.h5" > "$OUT/optim_xl_$o.log" 2>&1
    note "xl bf16 $o: $(brief "$OUT/optim_xl_$o.log")"
  done
  note "bench done at $(( $(date +%s) - T0 )) s"
fi
echo "==== summary"; cat "$summary"
