#!/usr/bin/env bash
# Attention on one GPU (docs/attention.md): build the attention test executable from its
# sources, run the gpu tests (every dtype / head dim / seq / causal case vs the float64 CPU
# reference), report registers/spills (-Xptxas -v), time the shapes below (public ops and raw
# tile variants, CUDA-event medians), compare accuracy with torch SDPA vs float64, and run the
# torch peer (SDPA) at the same shapes one after the other. Logs under $OUT (default /tmp/attn_out); a short table last.
# Shapes: "B H T D" (bf16, causal); default the 2.7B preset's attention (32 heads of 80) at
# batch 4 x 512 and 1 x 8192, and the leaderboard shape. ATTN_SHAPES overrides.
# Needs torch (pip install -r bench/requirements.txt) for the accuracy and SDPA columns.
#   scripts/gpu/attention.sh            ATTN_SHAPES="1 16 16384 64" scripts/gpu/attention.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-/tmp/attn_out}
mkdir -p "$OUT"
B=/tmp/attn_build
SHAPES=${ATTN_SHAPES:-"4 32 512 80;1 32 8192 80;1 16 16384 64"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
start=$(date +%s)
scripts/gpu/attention_build.sh "$B" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s" >> "$OUT/gpu.txt"
cp "$B/ptxas.log" "$OUT/ptxas.log"
EXE="$B/test_attention_cuda"

# 1. correctness (gpu label)
timeout ${ATTN_TEST_TIMEOUT:-200} "$EXE" ${ATTN_TEST_ARGS:-} > "$OUT/gpu_tests.log" 2>&1; tests_rc=$?
# 2. timing, 3. accuracy vs SDPA, 4. torch peer, per shape
IFS=';' read -ra shapes <<< "$SHAPES"
: > "$OUT/timing.log"; : > "$OUT/errors.log"; : > "$OUT/torch_peer.log"
for sh in "${shapes[@]}"; do
  read -r b h t d <<< "$sh"
  fv=0; bv=0
  [ "$d" = 160 ] && bv=0,2
  [ "$d" = 64 ] && bv=0,1
  skip_naive=$([ "$t" -gt 8192 ] && echo 1 || echo "")
  ATTN_B=$b ATTN_H=$h ATTN_SEQ=$t ATTN_D=$d ATTN_REPS=${ATTN_REPS:-30} ATTN_FWD_VARIANTS=$fv ATTN_BWD_VARIANTS=$bv \
    ATTN_SKIP_NAIVE=$skip_naive timeout 90 "$EXE" --gtest_also_run_disabled_tests \
    --gtest_filter='*DISABLED_Timing' >> "$OUT/timing.log" 2>&1
  if [ "$t" -le 8192 ]; then   # the float64 reference of longer shapes takes too long for one call
    echo "== B$b H$h T$t D$d" >> "$OUT/errors.log"
    timeout 75 python3 scripts/gpu/attention_errors.py "$EXE" --batch "$b" --heads "$h" --seq "$t" --head-dim "$d" \
      --causal >> "$OUT/errors.log" 2>&1
  fi
  timeout 60 python3 bench/torch_peer.py attention --batch "$b" --heads "$h" --seq "$t" --head-dim "$d" \
    --dtype bf16 --causal --impl sdpa --iters ${PEER_ITERS:-30} >> "$OUT/torch_peer.log" 2>&1
  timeout 60 python3 scripts/gpu/attention_sdpa_time.py --batch "$b" --heads "$h" --seq "$t" --head-dim "$d" \
    --causal --iters ${PEER_ITERS:-30} >> "$OUT/torch_peer.log" 2>&1
done

echo "==== device";      cat "$OUT/gpu.txt"
echo "==== ptxas (spilling tensor-core kernels; registers per kernel in ptxas.log)"
grep -B3 -E "[1-9][0-9]* bytes spill stores" "$OUT/ptxas.log" | grep -oE "Function properties for \S+|[0-9]+ bytes spill stores" | paste - - | head -8
echo "==== gpu tests rc=$tests_rc"; grep -E "^\[  (PASSED|FAILED) |FAILED|tests ran" "$OUT/gpu_tests.log" | head -20
python3 - "$OUT/gpu_tests.log" <<'PY'
import sys, collections
mx = collections.defaultdict(lambda: collections.defaultdict(float))
for line in open(sys.argv[1]):
    if not line.startswith("ERR "): continue
    f = line.split(); dt = f[1].split("_")[0]; impl = "flash"
    for i in range(2, len(f) - 1):
        if f[i] in ("flash", "naive"): impl = f[i]
        elif f[i] in ("O", "L", "dQ", "dK", "dV"): mx[dt + " " + impl][f[i]] = max(mx[dt + " " + impl][f[i]], float(f[i + 1]))
for k, v in sorted(mx.items()): print("max rel err", k, " ".join(f"{n} {x:.2e}" for n, x in v.items()))
PY
grep -E "^ERR .*_d80_t1000" "$OUT/gpu_tests.log"
echo "==== timing";      grep -E "SHAPE|TIME|^OP" "$OUT/timing.log"; grep -iE "error|fail" "$OUT/timing.log" | head -5
echo "==== errors vs float64"; grep -E "^==|^ +(tensor|o|dq|dk|dv|lse) |Error" "$OUT/errors.log" | head -40
echo "==== torch (peer: host timer; sdpa-events: CUDA events)"; grep -E "forward|Error" "$OUT/torch_peer.log" | tail -8
