#!/usr/bin/env bash
# Session 3 call (nvidia-h200-x2, carry .deps .device): GPU tests of the new work, issue 17's
# overlapped optimizer and bf16 gradient reduction with the peers, rank failure, the 8B step.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests perf rankfail lb}
OUT=${OUT:-/tmp/s3_out}
source scripts/device/session_lib.sh
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$summary"
if has build; then
  scripts/device/build.sh > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  for t in test_model_cuda test_fused_head_cuda test_ops_cuda_math test_vocab_parallel_cuda; do
    [ -x $BUILD/ctest/$t ] || continue
    CUDA_VISIBLE_DEVICES=0 timeout 200 $BUILD/ctest/$t > "$OUT/$t.log" 2>&1
    note "$t rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ') $(grep -a 'FAILED  \]' "$OUT/$t.log" | head -3 | tr '\n' ' ')"
  done
  [ $NGPU -ge 2 ] && timeout 200 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu > "$OUT/par_gpu.log" 2>&1
  note "parallel gpu np2 rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/par_gpu.log" | sort -u | tr '\n' ' ') $(grep -a 'FAILED  \]' "$OUT/par_gpu.log" | sort -u | head -4 | tr '\n' ' ')"
  timeout 100 "${MPIRUN[@]}" -np 2 $BUILD/ctest/mpi/mpi_test_nccl_comm > "$OUT/nccl.log" 2>&1
  note "nccl np2 rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/nccl.log" | sort -u | tr '\n' ' ')"
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
if has perf; then
  for ov in false true; do
    CUDA_VISIBLE_DEVICES=0 timeout 100 $LM inputs/bench_model_xl_bf16.ini --model.attention=flash --parallel.overlap_optimizer=$ov \
      --run.output="$OUT/xl1_$ov.h5" > "$OUT/xl1_$ov.log" 2>&1
    note "1 GPU xl flash overlap_optimizer=$ov: $(brief "$OUT/xl1_$ov.log")"
  done
  [ $NGPU -ge 2 ] && for v in "zero2 fp32" "zero2 bf16" "bucketed bf16"; do
    set -- $v
    extra=(); [ $1 = bucketed ] && extra=(--parallel.zero=none)
    timeout 100 "${MPIRUN[@]}" -np 2 $LM inputs/ddp_xl_zero2.ini --model.attention=flash --bench.batch_size=8 \
      --parallel.grad_reduce_dtype=$2 "${extra[@]}" --run.output="$OUT/dp_$1_$2.h5" > "$OUT/dp_$1_$2.log" 2>&1
    note "2 GPU $1 reduce $2: $(brief "$OUT/dp_$1_$2.log")"
  done
  [ $NGPU -ge 2 ] && NCCL_CTA_POLICY=1 timeout 100 "${MPIRUN[@]}" -x NCCL_CTA_POLICY -np 2 $LM inputs/ddp_xl_zero2.ini --model.attention=flash \
    --parallel.grad_reduce_dtype=bf16 --run.output="$OUT/dp_cta.h5" > "$OUT/dp_cta.log" 2>&1
  note "2 GPU zero2 bf16 NCCL_CTA_POLICY=1: $(brief "$OUT/dp_cta.log")"
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 $PEER model --size xl --precision bf16 --compile --attention sdpa > "$OUT/torch_model.log" 2>&1
  note "torch compile sdpa 1 GPU: $(grep '^{' "$OUT/torch_model.log" | tail -1 || tail -2 "$OUT/torch_model.log")"
  [ $NGPU -ge 2 ] && timeout 150 torchrun --nproc-per-node 2 $PEER ddp --size xl --precision bf16 --attention sdpa > "$OUT/torch_ddp.log" 2>&1
  note "torch ddp sdpa: $(grep '^{' "$OUT/torch_ddp.log" | tail -1 || tail -2 "$OUT/torch_ddp.log")"
  note "perf done at $(( $(date +%s) - T0 )) s"
fi
if has rankfail; then
  OUT=$OUT/rf timeout 150 scripts/device/rank_failure.sh kill hang > "$OUT/rank_failure.log" 2>&1
  note "rank failure: $(grep -aE 'PASS|FAIL|passed' "$OUT/rank_failure.log" | tr '\n' ' ')"
fi
if has lb; then
  timeout 240 "${MPIRUN[@]}" -np 2 $LM inputs/leaderboard_8b.ini --bench.steps=3 --run.output="$OUT/lb8b.h5" > "$OUT/lb8b.log" 2>&1
  note "8B leaderboard fsdp full-AC (rc $?): $(brief "$OUT/lb8b.log") $(grep -aE 'MFU|causal' "$OUT/lb8b.log" | head -3 | tr '\n' ' ')"
  tail -5 "$OUT/lb8b.log" >> "$summary"
fi
echo "==== summary"; cat "$summary"
