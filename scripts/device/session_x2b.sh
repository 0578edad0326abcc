#!/usr/bin/env bash
# One call on 2 GPUs (kind nvidia-h100-x2 or nvidia-h200-x2), carry [".deps", ".device"]: what the
# 2026-11-25 session still had to see on GPUs, in priority order.
#   scripts/device/session_x2b.sh [stages...]    stages: build tests recipes pp27 dp xlpp [cs229s memcheck]
# tests:   the 2-GPU suite (mpi_test_parallel_gpu: DDP/zero/fsdp/tp/pp against one GPU, and the
#          interleaved 1F1B over the grouped NCCL exchange, PipelineGpu.Interleaved*), the NCCL
#          communicator test; the recipes' GPU paths (session_recipes.sh text prune) run on
#          GPU 0 at the same time (correctness only, no timing there).
# pp27:    issue 12's second comparison: 2.7B bf16, global batch 4, 4 microbatches, pp = 2 1f1b,
#          against torch pipelining (torch_peer.py pp --size 2.7B --batch 4 --microbatches 4).
# dp:      issue 17 part 1: xl bf16 flash batch 4 per GPU, 1 GPU vs 2 GPUs zero2 and bucketed
#          with parallel.grad_reduce_dtype = fp32 | bf16.
# xlpp:    xl pp = 2 interleaved (V = 2) beside 1f1b, 8 microbatches.
# cs229s:  (not by default) issue 11's comparison in one call: 2.7B bf16 flash, tp = 2 vs fsdp vs
#          bucketed DDP at global batch 4, 8, 16 (1 warm-up + 2 steps; out of memory is a row).
# memcheck: (not by default) issue 21: the bf16 gradient reduction's staging (zero2, bucketed) and
#          the pipeline's per-rank predictions (/bench_model/memory_prediction_ranks), every phase.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests recipes pp27 dp xlpp}
OUT=${OUT:-/tmp/session_x2b_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
build_stage lmscale mpi_test_parallel_gpu mpi_test_nccl_comm
if has recipes; then
  (CUDA_VISIBLE_DEVICES=0 OUT=$OUT/recipes scripts/device/session_recipes.sh text prune > "$OUT/recipes.log" 2>&1) &
  recipes_pid=$!
fi
if has tests; then
  timeout 300 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu > "$OUT/par_gpu.log" 2>&1
  note "parallel gpu np2 rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/par_gpu.log" | sort -u | tr '\n' ' ') $(grep -a 'FAILED  \]' "$OUT/par_gpu.log" | sort -u | head -6 | tr '\n' ' ')"
  grep -aE '^\[       OK \] PipelineGpu' "$OUT/par_gpu.log" | sort -u >> "$summary"
  timeout 100 "${MPIRUN[@]}" -np 2 $BUILD/ctest/mpi/mpi_test_nccl_comm > "$OUT/nccl.log" 2>&1
  note "nccl np2 rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/nccl.log" | sort -u | tr '\n' ' ')"
fi
if has recipes; then
  wait $recipes_pid
  note "recipes (GPU 0):"; sed -n '/==== summary/,$p' "$OUT/recipes.log" | tail -n +2 >> "$summary"
fi
note "correctness done at $(( $(date +%s) - T0 )) s"
B27=(inputs/pp_xl_1f1b.ini --model.size=2.7B --bench.batch_size=4 --parallel.microbatches=4)
if has pp27; then
  CUDA_VISIBLE_DEVICES=0 timeout 120 $LM "${B27[@]}" --parallel.pp=1 --run.output="$OUT/b27_1gpu.h5" > "$OUT/b27_1gpu.log" 2>&1
  note "2.7B 1 GPU batch 4 (rc $?): $(brief "$OUT/b27_1gpu.log")"
  timeout 120 "${MPIRUN[@]}" -np 2 $LM "${B27[@]}" --run.output="$OUT/b27_pp.h5" > "$OUT/b27_pp.log" 2>&1
  note "2.7B pp=2 1f1b M=4 (rc $?): $(brief "$OUT/b27_pp.log")"
  grep -aE "^pipeline:|^  rank" "$OUT/b27_pp.log" >> "$summary"
  timeout 200 torchrun --nproc-per-node 2 $PEER pp --size 2.7B --precision bf16 --batch 4 --microbatches 4 \
    --schedule 1f1b --attention sdpa > "$OUT/torch_pp27.log" 2>&1
  note "torch pp 2.7B: $(grep '^{' "$OUT/torch_pp27.log" || tail -3 "$OUT/torch_pp27.log")"
fi
if has dp; then
  CUDA_VISIBLE_DEVICES=0 timeout 100 $LM inputs/bench_model_xl_bf16.ini --model.attention=flash \
    --run.output="$OUT/xl1.h5" > "$OUT/xl1.log" 2>&1
  note "1 GPU xl flash: $(brief "$OUT/xl1.log")"
  for v in "zero2 fp32" "zero2 bf16" "bucketed fp32" "bucketed bf16"; do
    set -- $v
    extra=(); [ $1 = bucketed ] && extra=(--parallel.zero=none)
    timeout 100 "${MPIRUN[@]}" -np 2 $LM inputs/ddp_xl_zero2.ini --model.attention=flash \
      --parallel.grad_reduce_dtype=$2 "${extra[@]}" --run.output="$OUT/dp_$1_$2.h5" > "$OUT/dp_$1_$2.log" 2>&1
    note "2 GPU $1 reduce $2: $(brief "$OUT/dp_$1_$2.log")"
  done
fi
if has xlpp; then
  for s in 1f1b interleaved; do
    extra=(); [ $s = interleaved ] && extra=(--parallel.schedule=interleaved --parallel.virtual_stages=2)
    timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/pp_xl_1f1b.ini "${extra[@]}" --run.output="$OUT/xlpp_$s.h5" > "$OUT/xlpp_$s.log" 2>&1
    note "xl pp=2 $s (rc $?): $(brief "$OUT/xlpp_$s.log")"
    grep -aE "^pipeline:|^  rank" "$OUT/xlpp_$s.log" >> "$summary"
  done
fi
if has cs229s; then   # session_tp.sh's stage (same runs, same summary), then the study against the batch
  OUT="$OUT" scripts/device/session_tp.sh cs229s > "$OUT/cs229s_stage.log" 2>&1
  python3 -m analysis.report "$OUT"/cs229s_*.h5 --out "$OUT/cs229s_report" --vs bench.batch_size > "$OUT/cs229s_report.log" 2>&1 \
    || tail -5 "$OUT/cs229s_report.log"
fi
if has memcheck; then
  for v in "zero2 bf16" "bucketed bf16"; do
    set -- $v
    extra=(); [ $1 = bucketed ] && extra=(--parallel.zero=none)
    timeout 100 "${MPIRUN[@]}" -np 2 $LM inputs/ddp_xl_zero2.ini --model.attention=flash --bench.warmup=1 --bench.steps=2 \
      --parallel.grad_reduce_dtype=$2 "${extra[@]}" --run.output="$OUT/mem_$1_$2.h5" > "$OUT/mem_$1_$2.log" 2>&1
    note "xl 2 GPU $1 reduce $2 (rc $?):"; memrows "$OUT/mem_$1_$2.h5"
  done
  for s in 1f1b interleaved; do
    extra=(); [ $s = interleaved ] && extra=(--parallel.schedule=interleaved --parallel.virtual_stages=2)
    timeout 100 "${MPIRUN[@]}" -np 2 $LM inputs/pp_xl_1f1b.ini "${extra[@]}" --bench.warmup=1 --bench.steps=2 \
      --run.output="$OUT/mem_pp_$s.h5" > "$OUT/mem_pp_$s.log" 2>&1
    note "xl pp 2 $s (rc $?):"; memrows "$OUT/mem_pp_$s.h5"
  done
  timeout 100 "${MPIRUN[@]}" -np 2 $LM "${B27[@]}" --bench.warmup=1 --bench.steps=2 --run.output="$OUT/mem_pp27.h5" \
    > "$OUT/mem_pp27.log" 2>&1
  note "2.7B pp 2 1f1b M 4 (rc $?):"; memrows "$OUT/mem_pp27.h5"
fi
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.h5' $(find . -name '*.log' -o -name 'summary.txt' -o -name '*.png' -o -name '*.md') 2>/dev/null)
find "$OUT" -name '*.log' -delete; find "$OUT" -name '*.h5' -size +2M -delete
echo "==== summary"; cat "$summary"
