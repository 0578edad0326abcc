#!/usr/bin/env bash
# One call on 2 GPUs (kind nvidia-h200-x2) for issues 3 and 6. Carry [".deps", ".device"].
#   scripts/device/session_2gpu.sh [stages...]    stages: build tests ddp collectives
# ddp: the 1-GPU xl bf16 step (batch 4), every data-parallel variant of inputs/ddp_xl_*.ini on 2
#      GPUs (global batch 8), and torch DDP (torchrun, bucket 25 MB) in the same call.
# collectives: bench-collectives on NCCL and on the mpi backend (shm, library) with the torch
#      peer (nccl, gloo) side by side.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests ddp collectives}
OUT=${OUT:-/tmp/session2_out}
source scripts/device/session_lib.sh

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
if has build; then
  scripts/device/build.sh > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  timeout 120 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/mpi/mpi_test_nccl_comm" > "$OUT/test_nccl_np2.log" 2>&1
  note "nccl tests on 2 GPUs: rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/test_nccl_np2.log" | tr '\n' ' ')"
fi
if has ddp; then
  CUDA_VISIBLE_DEVICES=0 timeout 120 $LM inputs/bench_model_xl_bf16.ini --bench.warmup=3 --bench.steps=8 \
    --run.output="$OUT/ddp_1gpu.h5" > "$OUT/ddp_1gpu.log" 2>&1
  note "1 GPU (batch 4): $(grep -E '^step ' "$OUT/ddp_1gpu.log")  $(grep -E 'peak memory' "$OUT/ddp_1gpu.log")"
  for v in naive flat overlap bucketed_1mb bucketed_10mb bucketed_100mb bucketed_1000mb zero1 zero1_broadcast zero2; do
    timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/ddp_xl_$v.ini --run.output="$OUT/ddp_$v.h5" > "$OUT/ddp_$v.log" 2>&1
    note "$v (rc $?): $(grep -E '^step ' "$OUT/ddp_$v.log")  $(grep -E '^comm ' "$OUT/ddp_$v.log" | awk '{print "comm", $2}') $(grep -E 'exposed' "$OUT/ddp_$v.log" | sed 's/.*exposed/exposed/')  $(grep -E 'peak memory' "$OUT/ddp_$v.log" | sed 's/.*peak/peak/')"
    grep -aiE "error" "$OUT/ddp_$v.log" | head -3
  done
  timeout 150 torchrun --nproc-per-node 2 $PEER ddp --size xl --precision bf16 > "$OUT/torch_ddp.log" 2>&1
  note "torch ddp: $(grep '^{' "$OUT/torch_ddp.log" || tail -3 "$OUT/torch_ddp.log")"
  note "ddp stage done at $(( $(date +%s) - T0 )) s"
fi
if has collectives; then
  timeout 150 "${MPIRUN[@]}" -np 2 $LM inputs/collectives_nccl.ini --run.output="$OUT/coll_nccl.h5" > "$OUT/coll_nccl.log" 2>&1
  note "lmscale nccl (rc $?):"; grep -aE "^# |^op |^all-reduce +fp32" "$OUT/coll_nccl.log" | tee -a "$summary"
  timeout 120 torchrun --nproc-per-node 2 $PEER collectives --backend nccl > "$OUT/torch_nccl.log" 2>&1
  grep '^{' "$OUT/torch_nccl.log" | tee -a "$summary"
  for algo in shm library; do
    timeout 150 "${MPIRUN[@]}" -np 2 $LM inputs/collectives_mpi.ini --bench.algo=$algo --run.output="$OUT/coll_mpi_$algo.h5" > "$OUT/coll_mpi_$algo.log" 2>&1
    note "lmscale mpi $algo (rc $?):"; grep -aE "^all-reduce +fp32" "$OUT/coll_mpi_$algo.log" | tee -a "$summary"
  done
  timeout 150 torchrun --nproc-per-node 2 $PEER collectives --backend gloo > "$OUT/torch_gloo.log" 2>&1
  grep '^{' "$OUT/torch_gloo.log" | tee -a "$summary"
  note "collectives stage done at $(( $(date +%s) - T0 )) s"
fi
echo "==== summary"; cat "$summary"
