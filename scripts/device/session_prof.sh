#!/usr/bin/env bash
# One call on one GPU (kind nvidia-h100-x1 or nvidia-h200), carry [".deps", ".device"]: where the
# time of an xl bf16 flash step goes, at the 1-GPU batch of 4 (issue 17 part 2) and at the
# pipeline's microbatch of one 512-token sequence (issue 12).
#   scripts/device/session_prof.sh [stages...]    stages: build mb trace ncu
# mb:     steps of xl bf16 flash at batch 8, 4, 2 and 1 (bench-model does not accumulate: batch 1
#         is the pipeline's microbatch).
# trace:  a Chrome trace (run.trace) of batch 1: host vs GPU time of every layer.
# ncu:    every kernel's duration in one timed step (Nsight Compute, gpu__time_duration only,
#         clocks and caches left alone) at batch 4 and at batch 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build mb trace ncu}
OUT=${OUT:-/tmp/session_prof_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$summary"
build_stage lmscale
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
if has mb; then
  for b in 8 4 2 1; do
    set -- b$b $b
    timeout 150 $LM "${XL[@]}" --bench.batch_size=$2 --run.output="$OUT/$1.h5" > "$OUT/$1.log" 2>&1
    note "xl $1 (rc $?): $(brief "$OUT/$1.log")"
  done
fi
if has trace; then
  timeout 150 $LM "${XL[@]}" --bench.batch_size=1 --bench.warmup=3 --bench.steps=3 \
    --run.trace="$OUT/b1.trace.json" --run.output="$OUT/b1_trace.h5" > "$OUT/b1_trace.log" 2>&1
  note "trace b1 (rc $?): $(brief "$OUT/b1_trace.log")"
  gzip -f "$OUT/b1.trace.json"
fi
# The logs so far, before ncu (which can run long): a call cut at its limit still returns them.
(cd "$OUT" && tar czf logs_pre_ncu.tgz $(find . -name '*.log' -o -name 'summary.txt') 2>/dev/null)
if has ncu; then
  # 2026-11-25: both ncu runs together outlasted the call's 600 s with 240 s each; now at most
  # 120 s and 2500 kernels each (one timed step of xl is ~2000 launches at batch 4).
  for v in "b4 4" "b1 1"; do
    set -- $v
    timeout 120 ncu --nvtx --nvtx-include "timed_step/" --launch-count 2500 --metrics gpu__time_duration.sum \
      --clock-control none --cache-control none --csv --log-file "$OUT/ncu_$1.csv" \
      $LM "${XL[@]}" --bench.batch_size=$2 --bench.warmup=3 --bench.steps=1 --run.output="$OUT/ncu_$1.h5" > "$OUT/ncu_$1.log" 2>&1
    note "ncu $1 (rc $?): $(wc -l < "$OUT/ncu_$1.csv") lines; $(brief "$OUT/ncu_$1.log")"
  done
  gzip -f "$OUT"/ncu_*.csv
fi
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.h5' $(find . -name '*.log' -o -name 'summary.txt') 2>/dev/null)
find "$OUT" -name '*.log' -delete; find "$OUT" -name '*.h5' -delete
echo "==== summary"; cat "$summary"
