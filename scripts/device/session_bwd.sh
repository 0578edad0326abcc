#!/usr/bin/env bash
# Issue 13/14: the sm90 attention backward with fewer live registers (32-bit shared addresses for
# the dS^T tile stores, lse2 / D loads and dQ staging at D = 64), A/B against an older kernel in
# one call. Carry [".deps", ".device"] (.device/flash_attention_sm90_bwd_old.cu: the kernel before,
# built beside the new one). The first call (2026-11-25) also timed P^T through shared memory,
# since removed (slower).
#   scripts/device/session_bwd.sh [stages...]
#   build   the attention test executable, new and old (/tmp/attn_new, /tmp/attn_old), and lmscale
#   tests   AttentionSm90.* (every dtype, head dim, causal, length case against float64 and FA2)
#           and the deterministic backward
#   time    old, new, old, new and torch SDPA at BWD_SHAPES (default d64 16k and d128 32k)
#   8b      the leaderboard deck (RUNS8B, default ck27) with the new kernel
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests time 8b}
OUT=${OUT:-/tmp/session_bwd_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name,clocks.max.sm --format=csv,noheader | tee -a "$summary"
if has build; then
  rm -rf /tmp/oldsrc && mkdir -p /tmp/oldsrc && cp -r include src ctest scripts /tmp/oldsrc/
  cp .device/flash_attention_sm90_bwd_old.cu /tmp/oldsrc/src/ops/cuda/flash_attention_sm90_bwd.cu
  scripts/device/attention_build.sh /tmp/attn_new > "$OUT/attn_new.log" 2>&1 &
  a=$!
  (cd /tmp/oldsrc && scripts/device/attention_build.sh /tmp/attn_old) > "$OUT/attn_old.log" 2>&1 &
  o=$!
  scripts/device/build.sh lmscale > "$OUT/build.log" 2>&1 || note "lmscale build FAILED: $(grep -m3 error "$OUT/build.log")"
  wait $a || { tail -20 "$OUT/attn_new.log"; exit 1; }
  wait $o || note "old attention build FAILED"
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
    for run in old:/tmp/attn_old new:/tmp/attn_new old2:/tmp/attn_old new2:/tmp/attn_new; do
      IFS=: read -r name dir <<< "$run"
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
