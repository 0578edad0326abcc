#!/usr/bin/env bash
# One GPU-machine call for attention (issue 5): build the attention test executable from its
# sources, run the gpu tests (every dtype/head_dim/seq/causal case vs the float64 CPU reference),
# report registers/spills (-Xptxas -v), time the leaderboard shape (batch 1, 16 heads, seq 16384,
# head_dim 64, bf16, causal) with tile variants, compare accuracy with torch SDPA vs float64, and
# run the torch peer at the same shape. Logs under $OUT; a short table last.
# Needs .device/torch_peer.py (a copy of ../shared/peers/torch_peer.py, carried in the tree).
set -uo pipefail
source scripts/device/env.sh 2>/dev/null || true
OUT=${OUT:-/tmp/attn_out}
mkdir -p "$OUT"
B=/tmp/attn_build
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
scripts/device/attention_build.sh "$B" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cp "$B/ptxas.log" "$OUT/ptxas.log"
EXE="$B/test_attention_cuda"

# 1. correctness (gpu label)
timeout 150 "$EXE" > "$OUT/gpu_tests.log" 2>&1; tests_rc=$?
# 2. timing at the leaderboard shape
timeout 60 "$EXE" --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_TimingLeaderboard*' > "$OUT/timing.log" 2>&1
# 3. accuracy vs torch SDPA on the same inputs (float64 reference)
timeout 75 python3 scripts/device/attention_errors.py "$EXE" --causal > "$OUT/errors.log" 2>&1
# 4. the torch peer
timeout 60 python3 .device/torch_peer.py attention --batch 1 --heads 16 --seq 16384 --head-dim 64 --dtype bf16 \
  --causal > "$OUT/torch_peer.log" 2>&1

echo "==== device";      cat "$OUT/gpu.txt"
echo "==== ptxas (registers / spills of the tensor-core kernels)"
grep -A2 "Compiling entry.*mma_kernel\|Compiling entry.*dkdv_kernel\|Compiling entry.*dq_kernel" "$OUT/ptxas.log" \
  | grep -E "registers|spill" | sort | uniq -c | head -8
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
grep "^ERR .*_d64_t1000" "$OUT/gpu_tests.log"
echo "==== timing";      grep -E "TIME|LEADERBOARD" "$OUT/timing.log"; grep -iE "error|fail" "$OUT/timing.log" | head -5
echo "==== errors vs float64"; tail -7 "$OUT/errors.log"
echo "==== torch peer";  cat "$OUT/torch_peer.log" | tail -3
