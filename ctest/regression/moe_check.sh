#!/usr/bin/env bash
# moe_check.sh LMSCALE CHECK_TABLE DECK GOLDEN OUTDIR
# The mixture-of-experts deck (tiny_moe.ini, capacity drops) against one process's stored losses
# in every layout it runs in (docs/moe.md): one process; 2 data-parallel ranks with ddp flat,
# zero1 and zero2; grad_accum 2; every-k activation checkpointing; a checkpoint at step 6 resumed
# to step 12. Then moe_check.py reads /train/moe and the saved weights (expert names).
set -euo pipefail
lmscale=$1 check=$2 deck=$3 golden=$4 out=$5
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
rm -f "$out"/moe_*
rtol=${RTOL:-2e-5}
run() {   # run NP NAME ARGS...
  local np=$1 name=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --allow-run-as-root -np "$np" "$lmscale" "$deck" --run.output="$out/moe_$name.h5" "$@"
  else
    "$lmscale" "$deck" --run.output="$out/moe_$name.h5" "$@"
  fi
  "$check" "$out/moe_$name.h5" /train/steps loss "$golden" "$rtol"
}
run 1 one --train.save="$out/moe_weights.h5"
run 2 ddp --parallel.ddp=flat
run 2 zero1 --parallel.zero=zero1
run 2 zero2 --parallel.zero=zero2
run 1 accum --train.grad_accum=2
run 1 everyk --train.activation_checkpointing=every-k
# Checkpoint at step 6, resume to 12: both halves equal the uninterrupted run.
"$lmscale" "$deck" --run.output="$out/moe_resume_a.h5" --train.steps=6 --train.checkpoint_every=6 \
  --optim.cosine_steps=12 --train.checkpoint_path="$out/moe_ckpt.h5"
"$lmscale" "$deck" --run.output="$out/moe_resume_b.h5" --train.steps=12 --train.resume="$out/moe_ckpt.h5" \
  --optim.cosine_steps=12 --train.checkpoint_path="$out/moe_ckpt2.h5"
grep -v '^#' "$golden" | head -n 6 > "$out/moe_golden_a.txt"
grep -v '^#' "$golden" | tail -n 6 > "$out/moe_golden_b.txt"
"$check" "$out/moe_resume_a.h5" /train/steps loss "$out/moe_golden_a.txt" "$rtol"
"$check" "$out/moe_resume_b.h5" /train/steps loss "$out/moe_golden_b.txt" "$rtol"
python3 "$here/moe_check.py" "$out"
