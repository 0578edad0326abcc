#!/usr/bin/env bash
# One call on 2 GPUs (kind nvidia-h200-x2) for issue 11 (tensor parallelism). Carry [".deps", ".device"].
#   scripts/device/session_tp.sh [stages...]
#   build   build everything on the device
#   tests   vocab-parallel CUDA kernels vs the CPU reference (1 GPU); the 2-GPU parallel test
#           (TensorParallelGpu: tp = 2, with and without sequence parallelism, bf16, vs one GPU;
#           then every data-parallel variant as before)
#   bench   2.7B bf16 flash, global batch 4 x 512, train step: one GPU, tp = 2, tp = 2 + sp, and
#           torch DTensor TP (torch_peer.py tp) in the same call.
#   cs229s  the CS229S comparison: 2.7B bf16 flash, tp = 2 vs fsdp vs DDP (bucketed) on 2 GPUs at
#           global batch 4, 8 and 16 (1 warm-up + 2 timed steps each); then
#           python3 -m analysis.report cs229s_*.h5 --out DIR --vs bench.batch_size Targets: tp = 2 step <= 0.62 x the
#           1-GPU step and <= 500.1/4 ms; peak memory per rank <= 0.6 x the 1-GPU peak.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests bench}
OUT=${OUT:-/tmp/session_tp_out}
source scripts/device/session_lib.sh

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
if has build; then
  scripts/device/build.sh > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  timeout 120 "$BUILD/ctest/test_vocab_parallel_cuda" > "$OUT/test_vocab_parallel_cuda.log" 2>&1
  note "vocab-parallel cuda kernels: rc=$? $(grep -aE '^\[  (PASSED|FAILED)|Expected|error' "$OUT/test_vocab_parallel_cuda.log" | head -6 | tr '\n' ' ')"
  timeout 300 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/parallel/mpi_test_parallel_gpu" --gtest_filter='TensorParallelGpu.*' > "$OUT/test_tp_gpu.log" 2>&1
  note "tp gpu test (2 GPUs): rc=$? $(grep -aE '^tp 2|^\[  (PASSED|FAILED)|Expected|actual' "$OUT/test_tp_gpu.log" | head -12 | tr '\n' ' ')"
  timeout 300 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/parallel/mpi_test_parallel_gpu" --gtest_filter='DataParallelGpu.*' > "$OUT/test_dp_gpu.log" 2>&1
  note "dp gpu test (2 GPUs, unchanged paths): rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/test_dp_gpu.log" | tr '\n' ' ')"
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
if has bench; then
  CUDA_VISIBLE_DEVICES=0 timeout 150 $LM inputs/tp_2.7B_1gpu.ini --run.output="$OUT/tp_1gpu.h5" > "$OUT/tp_1gpu.log" 2>&1
  note "2.7B 1 GPU batch 4x512: $(brief "$OUT/tp_1gpu.log")"
  for d in tp2 tp2_sp; do
    timeout 150 "${MPIRUN[@]}" -np 2 $LM inputs/tp_2.7B_$d.ini --run.output="$OUT/tp_$d.h5" > "$OUT/tp_$d.log" 2>&1
    note "2.7B $d: $(brief "$OUT/tp_$d.log")"
  done
  timeout 200 torchrun --nproc-per-node 2 $PEER tp --size 2.7B --precision bf16 --batch 4 --seq 512 --attention sdpa > "$OUT/torch_tp_sdpa.log" 2>&1
  note "torch DTensor tp (sdpa): $(grep '^{' "$OUT/torch_tp_sdpa.log" || tail -3 "$OUT/torch_tp_sdpa.log")"
  note "bench stage done at $(( $(date +%s) - T0 )) s"
fi
if has cs229s; then
  for b in 4 8 16; do
    for m in tp ddp fsdp; do
      case $m in
        tp) args=(--parallel.tp=2) ;;
        ddp) args=(--parallel.tp=1 --parallel.ddp=bucketed --parallel.bucket_mb=100) ;;
        fsdp) args=(--parallel.tp=1 --parallel.zero=fsdp) ;;
      esac
      timeout 60 "${MPIRUN[@]}" -np 2 $LM inputs/tp_2.7B_tp2.ini "${args[@]}" --bench.batch_size=$b --bench.warmup=1 \
        --bench.steps=2 --run.output="$OUT/cs229s_${m}_b$b.h5" > "$OUT/cs229s_${m}_b$b.log" 2>&1
      note "cs229s $m batch $b: $(brief "$OUT/cs229s_${m}_b$b.log") $(grep -oE 'tokens/s [0-9.]+' "$OUT/cs229s_${m}_b$b.log")"
    done
  done
  note "cs229s stage done at $(( $(date +%s) - T0 )) s"
fi
echo "==== summary"; cat "$summary"
