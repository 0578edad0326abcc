#!/usr/bin/env bash
# Issue 13/14: the sm90 attention kernels, A/B against other versions in one call. Carry
# [".deps", ".device"]: for each NAME in BWD_OLD (default "old": the kernel before),
# .device/flash_attention_sm90_{bwd,fwd}_NAME.cu (either or both) replace the working tree's files
# in a copy built beside the working tree's kernels ("new").
#   scripts/device/session_bwd.sh [stages...]
#   build   the attention test executable, new and each baseline (/tmp/attn_NAME), and lmscale
#           (when 8b is asked for too)
#   tests   AttentionSm90.* (every dtype, head dim, causal, length case against float64 and FA2)
#           and the deterministic backward
#   time    baselines, new, baselines, new and torch SDPA at BWD_SHAPES (default d64 16k, d128 32k)
#   ncu     Nsight Compute (--set full, clocks left alone) of one sm90 backward launch, each kernel,
#           at NCU_SHAPE (default B1 H32 T8192 d128): ncu_NAME.txt (details) and
#           ncu_NAME_src.csv (SASS lines with their warp-stall samples)
#   8b      the leaderboard deck (RUNS8B, default ck27) with the new kernel
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests time 8b}
OUT=${OUT:-/tmp/session_bwd_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name,clocks.max.sm --format=csv,noheader | tee -a "$summary"
# Kernels built beside the working tree's (new): .device/flash_attention_sm90_bwd_NAME.cu, NAME in
# ${BWD_OLD:-old} (the first is the baseline).
OLDS=${BWD_OLD:-old}
if has build; then
  pids=()
  for name in $OLDS; do
    rm -rf /tmp/src_$name && mkdir -p /tmp/src_$name && cp -r include src ctest scripts /tmp/src_$name/
    for k in fwd bwd; do
      f=.device/flash_attention_sm90_${k}_$name.cu
      [ -f "$f" ] && cp "$f" /tmp/src_$name/src/ops/cuda/flash_attention_sm90_$k.cu
    done
    (cd /tmp/src_$name && scripts/device/attention_build.sh /tmp/attn_$name) > "$OUT/attn_$name.log" 2>&1 &
    pids+=($!)
  done
  scripts/device/attention_build.sh /tmp/attn_new > "$OUT/attn_new.log" 2>&1 &
  a=$!
  if has 8b; then scripts/device/build.sh lmscale > "$OUT/build.log" 2>&1 || note "lmscale build FAILED: $(grep -m3 error "$OUT/build.log")"; fi
  wait $a || { tail -20 "$OUT/attn_new.log"; exit 1; }
  for p in "${pids[@]}"; do wait "$p" || note "a baseline attention build FAILED"; done
  grep -A2 "bwd_sm90_kernelI13__nv_bfloat16" /tmp/attn_new/ptxas.log | grep -E "spill" | sort | uniq -c >> "$summary"
  note "builds done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  timeout 200 /tmp/attn_new/test_attention_cuda --gtest_filter='*AttentionSm90*:AttentionCudaDeterministic.*' \
    > "$OUT/sm90_tests.log" 2>&1
  note "AttentionSm90 rc=$? $(grep -aE '^\[  PASSED|^\[  FAILED' "$OUT/sm90_tests.log" | head -2 | tr '\n' ' ')"
  grep -aE "^\[  FAILED \]|Failure" "$OUT/sm90_tests.log" | head -6 >> "$summary"
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
if has time; then
  IFS=';' read -ra shapes <<< "${BWD_SHAPES:-1 16 16384 64;1 32 32768 128}"
  for sh in "${shapes[@]}"; do
    read -r b h t d <<< "$sh"
    note "== B$b H$h T$t D$d causal bf16"
    for name in $OLDS new $OLDS new; do
      dir=/tmp/attn_$name
      env ATTN_B=$b ATTN_H=$h ATTN_SEQ=$t ATTN_D=$d ATTN_REPS=20 ATTN_FWD_VARIANTS=0 \
        ATTN_BWD_VARIANTS=0 ATTN_SKIP_NAIVE=1 timeout 120 "$dir/test_attention_cuda" --gtest_also_run_disabled_tests \
        --gtest_filter='*DISABLED_Timing' > "$OUT/time_${name}_$d.log" 2>&1
      note "$name: $(grep -E '^TIME sm90' "$OUT/time_${name}_$d.log" | sed 's/TIME sm90 //' | tr '\n' ' ')"
    done
    timeout 90 python3 scripts/device/attention_sdpa_time.py --batch "$b" --heads "$h" --seq "$t" --head-dim "$d" \
      --causal --iters 20 > "$OUT/sdpa_$d.log" 2>&1
    note "sdpa: $(tail -2 "$OUT/sdpa_$d.log" | tr '\n' ' ')"
  done
  note "time done at $(( $(date +%s) - T0 )) s"
fi
if has ncu; then
  read -r b h t d <<< "${NCU_SHAPE:-1 32 8192 128}"
  for name in ${NCU_KERNELS:-$OLDS new}; do
    dir=/tmp/attn_$name
    (( $(date +%s) - T0 < ${NCU_BEFORE_S:-450} )) || { note "ncu $name skipped: past ${NCU_BEFORE_S:-450} s"; continue; }
    env ATTN_B=$b ATTN_H=$h ATTN_SEQ=$t ATTN_D=$d ATTN_REPS=1 ATTN_FWD_VARIANTS=0 ATTN_BWD_VARIANTS=0 ATTN_SKIP_NAIVE=1 \
      timeout 240 ncu --clock-control none --set full --import-source no -k regex:flash_bwd_sm90_kernel -c 1 \
      -f -o "/tmp/ncu_$name" "$dir/test_attention_cuda" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Timing' \
      > "$OUT/ncu_run_$name.log" 2>&1
    note "ncu $name rc=$?"
    ncu --import "/tmp/ncu_$name.ncu-rep" --page details > "$OUT/ncu_$name.txt" 2>&1
    ncu --import "/tmp/ncu_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${name}_src.csv" 2>&1 \
      || note "ncu source page failed: $(head -c 300 "$OUT/ncu_${name}_src.csv")"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Shared Memory Throughput|L1/TEX Hit|Local" \
      "$OUT/ncu_$name.txt" | head -14 | sed "s/^/  $name /" >> "$summary"
  done
  (cd "$OUT" && tar czf ncu.tgz ncu_*.txt ncu_*_src.csv 2>/dev/null; rm -f ncu_*.txt ncu_*_src.csv)
  note "ncu done at $(( $(date +%s) - T0 )) s"
fi
if has 8b; then
  declare -A VARIANT=([deck]="" [ck27]="--train.checkpoint_layers=27")
  for name in ${RUNS8B:-ck27}; do
    # shellcheck disable=SC2086
    timeout 300 "${MPIRUN[@]}" -np 2 $LM inputs/leaderboard_8b.ini ${VARIANT[$name]} --bench.steps=3 \
      --run.output=/tmp/8b_$name.h5 > "$OUT/8b_$name.log" 2>&1
    note "8b $name (new backward): rc=$? $(brief "$OUT/8b_$name.log")"
  done
fi
note "total $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz *.log 2>/dev/null; rm -f *.log)
