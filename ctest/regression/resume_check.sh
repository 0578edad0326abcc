#!/usr/bin/env bash
# resume_check.sh LMSCALE CHECK_TABLE DECK GOLDEN OUTDIR
# Checkpoint/resume must be exact: train the regression deck for 6 of its 12 steps with a
# checkpoint at step 6, resume from it for steps 6..11, and compare both parts' losses with the
# uninterrupted run's stored losses (GOLDEN).
set -euo pipefail
lmscale=$1 check=$2 deck=$3 golden=$4 out=$5
mkdir -p "$out"
rm -f "$out"/resume_*
common=(--optim.cosine_steps=12 --train.checkpoint_path="$out/resume_ckpt.h5")
"$lmscale" "$deck" --run.output="$out/resume_a.h5" --train.steps=6 --train.checkpoint_every=6 "${common[@]}"
"$lmscale" "$deck" --run.output="$out/resume_b.h5" --train.steps=12 --train.resume="$out/resume_ckpt.h5" \
  --train.checkpoint_path="$out/resume_ckpt2.h5" --optim.cosine_steps=12
grep -v '^#' "$golden" | head -n 6 > "$out/resume_golden_a.txt"
grep -v '^#' "$golden" | tail -n 6 > "$out/resume_golden_b.txt"
"$check" "$out/resume_a.h5" /train/steps loss "$out/resume_golden_a.txt" "${RTOL:-2e-5}"
"$check" "$out/resume_b.h5" /train/steps loss "$out/resume_golden_b.txt" "${RTOL:-2e-5}"
