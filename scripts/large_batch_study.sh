#!/usr/bin/env bash
# The large-batch study (issue 16, docs/optimizers.md): the same 131,072 training tokens at global
# batch B = 4, 4B and 16B sequences with adamw and lamb, the LR scaled linearly with the batch
# (optim.reference_batch = B) and a warm-up of ~5% of each run; 16B reaches its batch with
# train.grad_accum = 4 (micro-batches of 4B). Then one plot of loss vs tokens for the six runs.
#   scripts/large_batch_study.sh [BUILD_DIR]      (default build; outputs/large_batch_study/)
# Runs one process per run, two runs at a time (2 cores), a few minutes in all.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUTDIR=outputs/large_batch_study
DECK=inputs/large_batch_study/base.ini
mkdir -p "$OUTDIR"
B=4
STEPS_B=1024
run() {   # optimizer multiple accum lr
  local opt=$1 k=$2 accum=$3 lr=$4
  local steps=$(( STEPS_B / k )) warmup=$(( (STEPS_B / k + 19) / 20 ))
  local out="$OUTDIR/${opt}_b$(( B * k )).h5"
  rm -f "$out"
  OPENBLAS_NUM_THREADS=1 "$BUILD/lmscale" "$DECK" --optim.name="$opt" --optim.lr="$lr" --optim.min_lr="$(python3 -c "print($lr/10)")" \
    --train.batch_size=$(( B * k )) --train.grad_accum="$accum" --train.steps="$steps" \
    --optim.warmup_steps="$warmup" --run.output="$out" > "$OUTDIR/${opt}_b$(( B * k )).log"
  echo "$out: $(grep -m1 '^optimizer:' "$OUTDIR/${opt}_b$(( B * k )).log")"
}
# Base learning rates at B (scaled by k inside lmscale): AdamW 2e-3, LAMB 1e-2 (LAMB's step is
# lr x ||w|| per layer, a relative step, so it takes a larger nominal LR).
for opt_lr in "adamw 2e-3" "lamb 1e-2"; do
  set -- $opt_lr
  run "$1" 1 1 "$2" & p1=$!
  run "$1" 4 1 "$2" & p4=$!
  wait $p1 && wait $p4
  run "$1" 16 4 "$2"
done
python3 -m analysis.large_batch_study "$OUTDIR" --png docs/figures/large_batch_study.png
