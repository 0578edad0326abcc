#!/usr/bin/env bash
# One call on 2 GPUs (kind nvidia-h100-x2), carry [".deps", ".device"]: the batched q/k/v and
# w1/w3 GEMMs (ops::linear_group) and the fused residual add + norm, in priority order. Every
# stage appends to $OUT/summary.txt as it ends.
#   scripts/device/session_fuse.sh [stages...]    stages: build gputests bench pp suite dp [memtune]
# gputests: the linear and norm ops and the model against the CPU reference (GPU 0).
# bench:    xl bf16 flash at batch 1 (the pipeline's microbatch) and 4 (GPU 0).
# pp:       xl pp = 2 1f1b, 8 microbatches.
# suite:    the 2-GPU parallel suite (DDP/zero/fsdp/tp/pp against one GPU).
# dp:       xl zero2 on 2 GPUs.
# memtune:  every rank's predicted vs measured phases of xl pp = 2, with and without GEMM autotuning.
# A baseline in the same call: BASE_EXE=path of another lmscale build carried in an ignored folder
# (the device's copy of the repository has no history to build an older commit from); the
# timing stages then run it too, as "base".
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build gputests bench pp suite dp}
OUT=${OUT:-/tmp/session_fuse_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
builds=(new); [ -n "${BASE_EXE:-}" ] && builds+=(base)
exe_of() { [ "$1" = base ] && echo "$BASE_EXE" || echo "$LM"; }
build_stage lmscale test_ops_cuda_math test_model_cuda mpi_test_parallel_gpu
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
if has gputests; then
  for t in test_ops_cuda_math test_model_cuda; do
    CUDA_VISIBLE_DEVICES=0 timeout 150 $BUILD/ctest/$t --gtest_brief=1 > "$OUT/$t.log" 2>&1
    note "$t rc=$? $(grep -aE '^\[  (PASSED|FAILED)|FAILED  \]' "$OUT/$t.log" | sort -u | head -8 | tr '\n' ' ')"
  done
fi
if has bench; then
  for b in 1 4; do
    for which in "${builds[@]}"; do
      CUDA_VISIBLE_DEVICES=0 timeout 100 "$(exe_of $which)" "${XL[@]}" --bench.batch_size=$b \
        --run.output="$OUT/b${b}_$which.h5" > "$OUT/b${b}_$which.log" 2>&1
      note "xl b$b $which (rc $?): $(brief "$OUT/b${b}_$which.log")"
    done
  done
fi
if has pp; then
  for which in "${builds[@]}"; do
    timeout 120 "${MPIRUN[@]}" -np 2 "$(exe_of $which)" inputs/pp_xl_1f1b.ini --run.output="$OUT/pp_$which.h5" \
      > "$OUT/pp_$which.log" 2>&1
    note "xl pp=2 1f1b $which (rc $?): $(brief "$OUT/pp_$which.log")"
    grep -aE "^pipeline:|^  rank" "$OUT/pp_$which.log" >> "$summary"
  done
fi
if has suite; then
  timeout 240 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu > "$OUT/par_gpu.log" 2>&1
  note "parallel gpu np2 rc=$? $(grep -aE '(PASSED|FAILED)  \]' "$OUT/par_gpu.log" | sort -u | tr '\n' ' ')"
fi
if has dp; then
  for which in "${builds[@]}"; do
    timeout 100 "${MPIRUN[@]}" -np 2 "$(exe_of $which)" inputs/ddp_xl_zero2.ini --model.attention=flash \
      --run.output="$OUT/dp_$which.h5" > "$OUT/dp_$which.log" 2>&1
    note "xl zero2 2 GPUs $which (rc $?): $(brief "$OUT/dp_$which.log")"
  done
fi
if has memtune; then
  for tune in true false; do
    timeout 100 "${MPIRUN[@]}" -np 2 $LM inputs/pp_xl_1f1b.ini --precision.gemm_autotune=$tune --bench.warmup=1 \
      --bench.steps=2 --run.output="$OUT/mt_pp_$tune.h5" > "$OUT/mt_pp_$tune.log" 2>&1
    note "pp autotune $tune (rc $?):"
    memrows "$OUT/mt_pp_$tune.h5"
  done
fi
note "done at $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.h5' $(find . -name '*.log') 2>/dev/null)
find "$OUT" -name '*.log' -delete; find "$OUT" -name '*.h5' -delete
echo "==== summary"; cat "$summary"
