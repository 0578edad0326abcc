#!/usr/bin/env bash
# One GPU-machine call for the single-GPU issues (2, 4, 5): build everything, run the gpu tests,
# then the benchmarks side by side with the PyTorch peer (.device/torch_peer.py, a copy of
# ../shared/peers/torch_peer.py carried in the ignored folder .device/). Carry [".deps", ".device"].
#   scripts/device/session_1gpu.sh [stages...]   stages: build tests model compile check attention memory
# Logs and HDF5 outputs go to $OUT; a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
OUT=${OUT:-/tmp/session_out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-device}
LM=$BUILD/lmscale
PEER=.device/torch_peer.py
stages=${*:-build tests model check attention}
has() { [[ " $stages " == *" $1 "* ]]; }
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$summary"
if has build; then
  t=$(date +%s)
  if ! scripts/device/build.sh > "$OUT/build.log" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.log" | head -30; tail -5 "$OUT/build.log"; exit 1
  fi
  note "build: $(( $(date +%s) - t )) s"
fi
if has tests; then
  timeout 240 ctest --test-dir "$BUILD" -L gpu -E "np2" --output-on-failure > "$OUT/ctest_gpu.log" 2>&1
  note "gpu tests: $(grep -E 'tests passed|tests failed' "$OUT/ctest_gpu.log")"
  grep -E "^\s+[0-9]+ - .*(Failed|Timeout|SEGFAULT|Exception)" "$OUT/ctest_gpu.log" | tee -a "$summary"
fi
if has model; then
  for p in fp32 bf16; do
    timeout 150 $LM inputs/bench_model_xl_$p.ini --run.output="$OUT/bench_xl_$p.h5" > "$OUT/bench_xl_$p.log" 2>&1
    note "lmscale xl $p (rc $?):"; tail -9 "$OUT/bench_xl_$p.log" | tee -a "$summary"
  done
  timeout 120 python3 $PEER model --size xl --precision fp32 > "$OUT/peer_fp32.log" 2>&1; tail -1 "$OUT/peer_fp32.log" | tee -a "$summary"
  timeout 90 python3 $PEER model --size xl --precision bf16 > "$OUT/peer_bf16.log" 2>&1; tail -1 "$OUT/peer_bf16.log" | tee -a "$summary"
fi
if has compile; then
  timeout ${COMPILE_TIMEOUT:-280} python3 $PEER model --size xl --precision bf16 --compile > "$OUT/peer_bf16_compile.log" 2>&1
  note "torch compile (rc $?):"; tail -1 "$OUT/peer_bf16_compile.log" | tee -a "$summary"
fi
if has check; then
  # Issue 2: weights written by lmscale load by name into the PyTorch model with the same loss.
  # (a) the `small` preset at initialisation (one step at lr 1e-30) on uniform tokens: ~ ln(10000);
  # (b) the trained quickstart model on its own vocabulary.
  python3 - "$OUT" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
for name, V in (("small", 10000), ("quick", 512)):
    t = rng.integers(0, V, size=(4, 129)).astype(np.int32)
    np.save(f"{sys.argv[1]}/tok_{name}.npy", t); t.tofile(f"{sys.argv[1]}/tok_{name}.i32")
PY
  timeout 120 $LM inputs/train_small_cpu.ini --parallel.device=cuda --train.steps=1 --optim.lr=1e-30 --optim.min_lr=0 \
    --optim.warmup_steps=0 --train.eval_every=0 --model.context_length=128 --run.output="$OUT/small_init.h5" \
    --train.save="$OUT/small_init_w.h5" > "$OUT/small_init.log" 2>&1
  timeout 120 $LM inputs/quickstart.ini --run.output="$OUT/quick.h5" --train.save="$OUT/quick_w.h5" > "$OUT/quick.log" 2>&1
  note "issue 2 check (natural log of 10000 = 9.2103):"
  for pair in "small_init_w tok_small 12" "quick_w tok_quick 4"; do
    set -- $pair
    $BUILD/ctest/regression/eval_weights "$OUT/$1.h5" "$OUT/$2.i32" 4 129 $3 | tee -a "$summary"
    timeout 120 python3 $PEER check --checkpoint "$OUT/$1.h5" --tokens "$OUT/$2.npy" --heads $3 2>&1 | tail -1 | tee -a "$summary"
  done
fi
if has attention; then
  timeout 120 $LM inputs/attention_leaderboard.ini --run.output="$OUT/attention_leaderboard.h5" > "$OUT/attention.log" 2>&1
  note "lmscale bench-attention leaderboard (rc $?):"; tail -8 "$OUT/attention.log" | tee -a "$summary"
  timeout 90 python3 $PEER attention --batch 1 --heads 16 --seq 16384 --head-dim 64 --dtype bf16 --causal > "$OUT/peer_attention.log" 2>&1
  tail -2 "$OUT/peer_attention.log" | tee -a "$summary"
fi
if has memory; then
  for ctx in 128 256 512; do for m in forward train-step; do
    timeout 100 $LM inputs/memory_2.7B_ctx${ctx}_${m}.ini --run.output="$OUT/memory_${ctx}_${m}.h5" > "$OUT/memory_${ctx}_${m}.log" 2>&1
    note "2.7B ctx $ctx $m: $(grep -E 'peak memory' "$OUT/memory_${ctx}_${m}.log")"
  done; done
fi
echo "==== summary"; cat "$summary"
