#!/usr/bin/env bash
# The 2026-11-26 (fourth) session's device runs (docs/performance.md). Carry [".deps", ".device"].
#   scripts/device/session_s8.sh [stages...]
#   build   build lmscale and the GPU tests named below
#   gtest   (1 GPU) test_model_cuda, test_ops_cuda_elementwise, test_ops_cuda_math,
#           test_optimizer_steps_cuda, test_attention_cuda (or the list in $GTESTS)
#   ncu     (1 GPU) every kernel's duration in one timed xl bf16 flash step at batch 4 (Nsight
#           Compute, gpu__time_duration only), summed per kernel name; the ordered list comes back
#   xl      (1 GPU) xl bf16 flash, batch 4, three runs
#   steps   (1 GPU) xl bf16 flash, 30 timed steps: every step's phases (the outliers), then 12 with
#           run.trace (allocator events included), the trace returned
#   probe   (1 GPU) scripts/device/overlap_probe.cu: AdamW beside GEMMs, SMs split or not
#   tests   (2 GPUs) $SUITE (default DataParallelGpu.*)
#   dp      (2 GPUs) bucketed DDP and zero2 over the copy engines, xl bf16 flash, against 1 GPU
#   peers   torch.compile + SDPA on one GPU (peer1) and torch DDP on 2 GPUs (peer2, when present)
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build gtest ncu xl}
OUT=${OUT:-/tmp/session_s8_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$summary"
ngpu=$(nvidia-smi -L | wc -l)
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
Z2=(inputs/ddp_xl_zero2.ini --model.attention=flash --parallel.grad_exchange=copy-engine)
DDP=(inputs/ddp_xl_zero2.ini --model.attention=flash --parallel.zero=none --parallel.ddp=bucketed
     --parallel.grad_exchange=copy-engine)
targets=(lmscale)
read -ra GTESTS <<< "${GTESTS:-test_model_cuda test_ops_cuda_elementwise test_ops_cuda_math test_optimizer_steps_cuda test_attention_cuda}"
has gtest && targets+=("${GTESTS[@]}")
has tests && targets+=(mpi_test_parallel_gpu)
build_stage "${targets[@]}"
if has gtest; then
  for t in "${GTESTS[@]}"; do
    exe=$(find $BUILD -name $t -type f | head -1)
    timeout 300 $exe --gtest_color=no > "$OUT/$t.log" 2>&1
    note "$t rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  done
fi
if has ncu; then
  timeout ${NCU_S:-330} ncu --nvtx --nvtx-include "timed_step/" --launch-count 2500 --metrics gpu__time_duration.sum \
    --clock-control none --cache-control none --csv --log-file "$OUT/ncu_b4.csv" \
    $LM "${XL[@]}" --bench.warmup=2 --bench.steps=1 --run.output=/tmp/ncu_b4.h5 > "$OUT/ncu_b4.log" 2>&1
  note "ncu b4 (rc $?) at $(( $(date +%s) - T0 )) s: $(wc -l < "$OUT/ncu_b4.csv") lines"
  python3 scripts/device/ncu_kernel_summary.py "$OUT/ncu_b4.csv" | tee -a "$summary"
  gzip -f "$OUT/ncu_b4.csv"
fi
if has steps; then
  CUDA_VISIBLE_DEVICES=0 timeout 150 $LM "${XL[@]}" --bench.steps=30 --run.output=/tmp/steps.h5 > "$OUT/steps.log" 2>&1
  note "xl 30 steps: $(brief "$OUT/steps.log")"
  python3 - /tmp/steps.h5 <<'PY' | tee -a "$summary"
import sys, h5py
t = h5py.File(sys.argv[1], "r")["/bench_model/steps"][:]
names = t.dtype.names
print("steps columns:", names)
for r in t:
    print(" ".join(f"{r[n]:.2f}" if isinstance(r[n], float) else str(r[n]) for n in names))
PY
  CUDA_VISIBLE_DEVICES=0 timeout 150 $LM "${XL[@]}" --bench.steps=12 --run.trace="$OUT/xl1.trace.json" \
    --bench.memory_timeline=true --run.output=/tmp/trace.h5 > "$OUT/trace.log" 2>&1
  note "xl 12 steps with run.trace: $(brief "$OUT/trace.log")"
  gzip -f "$OUT/xl1.trace.json"
fi
if has probe; then
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a scripts/device/overlap_probe.cu -lcublas -o /tmp/overlap_probe &&
    timeout 200 /tmp/overlap_probe 2>&1 | tee -a "$summary"
fi
if has xl; then
  for rep in 1 2 3; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 $LM "${XL[@]}" --run.output=/tmp/xl1.h5 > "$OUT/xl1_$rep.log" 2>&1
    note "1 GPU ($rep): $(brief "$OUT/xl1_$rep.log")"
  done
fi
if has tests && (( ngpu >= 2 )); then
  timeout 300 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu \
    --gtest_filter="${SUITE:-DataParallelGpu.*}" --gtest_color=no > "$OUT/par.log" 2>&1
  note "${SUITE:-DataParallelGpu.*} rc=$? $(grep -aE '^\[  (PASSED|FAILED)|^\[       OK|Failure' "$OUT/par.log" | sort -u | tr '\n' ' ')"
fi
if has dp && (( ngpu >= 2 )); then
  for rep in 1 2; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 $LM "${XL[@]}" --run.output=/tmp/xl1.h5 > "$OUT/dpxl1_$rep.log" 2>&1
    note "1 GPU ($rep): $(brief "$OUT/dpxl1_$rep.log")"
    timeout 150 "${MPIRUN[@]}" -np 2 $LM "${DDP[@]}" --run.output=/tmp/ddp.h5 > "$OUT/ddp_$rep.log" 2>&1
    note "bucketed DDP copy-engine ($rep): rc=$? $(brief "$OUT/ddp_$rep.log")"
    timeout 150 "${MPIRUN[@]}" -np 2 $LM "${Z2[@]}" --run.output=/tmp/z2.h5 > "$OUT/z2_$rep.log" 2>&1
    note "zero2 copy-engine ($rep): rc=$? $(brief "$OUT/z2_$rep.log")"
  done
fi
has peers && stages="$stages peer1 peer2"
if has peer1; then
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $PEER model --size xl --precision bf16 --compile --attention sdpa > "$OUT/peer.log" 2>&1
  note "torch.compile xl: rc=$? $(grep '^{' "$OUT/peer.log" || tail -3 "$OUT/peer.log")"
fi
if has peer2 && (( ngpu >= 2 )); then
    timeout 200 torchrun --nproc-per-node 2 $PEER ddp --size xl --precision bf16 --batch 4 --attention sdpa > "$OUT/ddp_peer.log" 2>&1
    note "torch DDP xl: rc=$? $(grep '^{' "$OUT/ddp_peer.log" || tail -3 "$OUT/ddp_peer.log")"
fi
note "total $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz $(find . -maxdepth 1 -name '*.log') 2>/dev/null; rm -f ./*.log)
