#!/usr/bin/env bash
# Issue 13 (Hopper FlashAttention) in one GPU-machine call, carry [".deps", ".device"]:
#   build   the attention test executable (scripts/device/attention_build.sh) and lmscale
#   tests   the sm90 kernels vs the float64 reference and FA2 (AttentionSm90.*), then the public
#           ops at head dims 64/128 (which now take the sm90 kernels) in the existing suite
#   sass    HGMMA / SETMAXREG counts of the sm90 kernels (cuobjdump), ptxas registers and spills
#   time    our kernels (sm90 and FA2, CUDA-event medians) and torch SDPA at the issue's shapes
#   errors  accuracy vs float64 of ours and SDPA's on the same bf16 inputs
#   ncu     Nsight Compute sections of the sm90 kernels at the leaderboard shape
#   model   xl bf16 bench-model train step with flash (sm90 and FA2) and torch.compile + SDPA
# Logs under $OUT; the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests sass time errors ncu model}
OUT=${OUT:-/tmp/fa3_out}
source scripts/device/session_lib.sh
AB=/tmp/attn_build
EXE=${ATTN_EXE:-$AB/test_attention_cuda}   # ATTN_EXE: time another build (A/B)
SHAPES=${ATTN_SHAPES:-"1 16 16384 64;1 32 32768 128;4 25 512 64"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee -a "$summary"

if has build; then
  scripts/device/attention_build.sh "$AB" > "$OUT/attn_build.log" 2>&1 &
  ab=$!
  if has model; then scripts/device/build.sh lmscale > "$OUT/build.log" 2>&1 || note "lmscale build FAILED: $(grep -m3 -E 'error' "$OUT/build.log")"; fi
  if has gputests; then scripts/device/build.sh > "$OUT/build_all.log" 2>&1 || note "build FAILED: $(grep -m3 -E 'error' "$OUT/build_all.log")"; fi
  wait $ab || { tail -30 "$OUT/attn_build.log"; exit 1; }
  cp "$AB/ptxas.log" "$OUT/ptxas.log"
  note "builds done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  timeout 300 "$EXE" --gtest_filter='*AttentionSm90*' > "$OUT/sm90_tests.log" 2>&1
  note "sm90 tests rc=$? $(grep -aE '^\[  PASSED|^\[  FAILED|SKIPPED \]' "$OUT/sm90_tests.log" | head -3 | tr '\n' ' ')"
  grep -aE "^\[  FAILED \]" "$OUT/sm90_tests.log" | head -12 >> "$summary"
  python3 - "$OUT/sm90_tests.log" <<'PY' | tee -a "$summary"
import sys, collections
mx = collections.defaultdict(dict)
for line in open(sys.argv[1], errors="replace"):
    if not line.startswith("SM90 "): continue
    f = line.split(); key = "_".join(f[1].split("_")[:2]); impl = "sm90"
    for i in range(2, len(f) - 1):
        if f[i] == "|": continue
        if f[i] == "FA2": impl = "fa2"; continue
        if f[i] in ("O", "L", "dQ", "dK", "dV"):
            k = impl + " " + f[i]; mx[key][k] = max(mx[key].get(k, 0.0), float(f[i + 1]))
for k, v in sorted(mx.items()): print("max rel err", k, " ".join(f"{n} {x:.2e}" for n, x in v.items()))
PY
  grep -aE "Failure|Expected|Which is|error:" "$OUT/sm90_tests.log" | head -10 >> "$summary"
  timeout 200 "$EXE" --gtest_filter='All/AttentionCuda.*_d64_*:All/AttentionCuda.*_d128_*:AttentionCudaFallback.*:AttentionCudaDeterministic.*' \
    > "$OUT/public_tests.log" 2>&1
  note "public-op tests d64/d128 + deterministic rc=$? $(grep -aE '^\[  PASSED|^\[  FAILED' "$OUT/public_tests.log" | head -2 | tr '\n' ' ')"
  grep -aE "^\[  FAILED \]" "$OUT/public_tests.log" | head -8 >> "$summary"
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
if has gputests; then
  timeout 240 ctest --test-dir "$BUILD" -L gpu -R "model_cuda|fused_head|ops_cuda" -E "np2|np4" --output-on-failure \
    > "$OUT/ctest_gpu.log" 2>&1
  note "ctest gpu (model, fused head, ops) rc=$? $(grep -aE 'tests passed|tests failed' "$OUT/ctest_gpu.log")"
  grep -aE "^\s+[0-9]+ - .*(Failed|Timeout|SEGFAULT|Exception)" "$OUT/ctest_gpu.log" >> "$summary"
fi
if has sass; then
  grep -A2 -E "sm90_(fwd|bwd)" "$OUT/ptxas.log" | grep -E "Used|spill" | paste - - | sort | uniq -c | head -8 >> "$summary"
  if command -v cuobjdump > /dev/null; then
    cuobjdump -sass "$AB/obj/flash_attention_sm90_fwd.cu.o" > "$OUT/fwd.sass" 2>&1
    cuobjdump -sass "$AB/obj/flash_attention_sm90_bwd.cu.o" > "$OUT/bwd.sass" 2>&1
    note "SASS fwd: HGMMA $(grep -c HGMMA "$OUT/fwd.sass") SETMAXREG $(grep -c SETMAXREG "$OUT/fwd.sass") UTMALDG $(grep -c UTMALDG "$OUT/fwd.sass") LDL/STL $(grep -cE 'LDL|STL' "$OUT/fwd.sass")"
    note "SASS bwd: HGMMA $(grep -c HGMMA "$OUT/bwd.sass") SETMAXREG $(grep -c SETMAXREG "$OUT/bwd.sass") UTMALDG $(grep -c UTMALDG "$OUT/bwd.sass") LDL/STL $(grep -cE 'LDL|STL' "$OUT/bwd.sass")"
  else
    note "cuobjdump not found"
  fi
fi
if has time; then
  IFS=';' read -ra shapes <<< "$SHAPES"
  for sh in "${shapes[@]}"; do
    read -r b h t d <<< "$sh"
    ATTN_B=$b ATTN_H=$h ATTN_SEQ=$t ATTN_D=$d ATTN_REPS=${ATTN_REPS:-20} ATTN_FWD_VARIANTS=0 ATTN_BWD_VARIANTS=0 \
      ATTN_SKIP_NAIVE=1 timeout 120 "$EXE" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Timing' \
      > "$OUT/time_${b}_${h}_${t}_${d}.log" 2>&1
    note "== B$b H$h T$t D$d causal bf16 (rc $?)"
    grep -E "^TIME|^OP" "$OUT/time_${b}_${h}_${t}_${d}.log" | tee -a "$summary" > /dev/null
    timeout 90 python3 scripts/device/attention_sdpa_time.py --batch "$b" --heads "$h" --seq "$t" --head-dim "$d" \
      --causal --iters 20 > "$OUT/sdpa_${b}_${h}_${t}_${d}.log" 2>&1
    tail -2 "$OUT/sdpa_${b}_${h}_${t}_${d}.log" | tee -a "$summary" > /dev/null
  done
  note "time done at $(( $(date +%s) - T0 )) s"
fi
if has errors; then
  for sh in "1 16 4096 64" "1 8 4096 128"; do
    read -r b h t d <<< "$sh"
    timeout 90 python3 scripts/device/attention_errors.py "$EXE" --batch "$b" --heads "$h" --seq "$t" --head-dim "$d" \
      --causal > "$OUT/errors_${t}_${d}.log" 2>&1
    note "== errors vs float64 B$b H$h T$t D$d causal (rc $?)"
    grep -vE "^\s*$" "$OUT/errors_${t}_${d}.log" | tail -8 | tee -a "$summary" > /dev/null
  done
fi
if has ncu && command -v ncu > /dev/null; then
  for k in flash_fwd_sm90_kernel flash_bwd_sm90_kernel; do
    ATTN_B=1 ATTN_H=16 ATTN_SEQ=16384 ATTN_D=64 ATTN_REPS=1 ATTN_FWD_VARIANTS=0 ATTN_BWD_VARIANTS=0 ATTN_SKIP_NAIVE=1 \
      timeout 150 ncu --kernel-name regex:$k --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
      "$EXE" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Timing' > "$OUT/ncu_$k.log" 2>&1
    note "ncu $k rc=$?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Dynamic Shared Memory Per Block|Achieved Occupancy|Executed Ipc Active|L2 Hit Rate|DRAM Throughput|Warp Cycles Per Issued|One or More Eligible|Stall" \
      "$OUT/ncu_$k.log" | sed -E 's/\s+/ /g' | cut -c1-120 | head -16 >> "$summary"
  done
fi
if has model; then
  for impl in sm90 fa2; do
    env_flag=""; [ "$impl" = fa2 ] && env_flag="LMSCALE_FLASH_SM90=0"
    env $env_flag timeout 150 $LM inputs/bench_model_xl_bf16.ini --model.attention=flash \
      --run.output="$OUT/bench_xl_$impl.h5" > "$OUT/bench_xl_$impl.log" 2>&1
    note "lmscale xl bf16 flash ($impl, rc $?): $(brief "$OUT/bench_xl_$impl.log")"
  done
  timeout 240 python3 $PEER model --size xl --precision bf16 --attention sdpa --compile > "$OUT/peer_compile.log" 2>&1
  note "torch.compile + SDPA xl bf16 (rc $?): $(tail -1 "$OUT/peer_compile.log")"
fi
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.h5' *.log *.sass summary.txt 2>/dev/null; rm -f *.log *.sass)
echo "==== summary"; cat "$summary"
