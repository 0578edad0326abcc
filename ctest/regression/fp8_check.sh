#!/usr/bin/env bash
# fp8_check.sh LMSCALE DECK OUTDIR
# precision.mode = fp8 on CPU (the exact emulation of the FP8 GEMMs; docs/precision.md "FP8
# training") with tiny_fp8.ini, every comparison made by fp8_check.py:
#   1. against the same deck in fp32: every step's loss within 2% and some step differing (the
#      FP8 layers really ran), current and delayed scaling;
#   2. on 2 data-parallel ranks (ddp flat, zero2, fsdp, fsdp with the optimizer offloaded) against
#      one process running the same micro-batches (grad_accum 2), current scaling: within 1e-5
#      (each rank's scales come from its own rows, the one process's from each micro-batch's);
#      fsdp with FP8 weight gathers bitwise equal to fsdp with compute-dtype gathers (losses,
#      gradient norms, recorded amaxes and scales) on 2 ranks (checkpointing, no resharding,
#      offload) and 4, and within 1e-5 of one process;
#   3. activation checkpointing (every-k, every-k k 2 with keep_attention, selective,
#      selective-mlp) against none, current and delayed: losses, gradient norms, the recorded
#      amaxes and scales and the amax histories bitwise equal (the recompute casts with the first
#      forward's scales and records nothing);
#   4. evaluations (train.eval_every) leave delayed scaling's training untouched (bitwise);
#   5. the results file: /train/fp8 and /train/fp8_amax_history shapes and attributes;
#   6. current scaling across a checkpoint and resume, bitwise; delayed scaling too (its amax
#      histories and scales are in the checkpoints, per rank): a single-file checkpoint on 1 and 2
#      ranks (one with a window of 4 that wraps around the checkpoint) and a sharded one on 2
#      ranks, each resumed on as many ranks, bitwise; resumed on another rank count or window
#      length, the run warns that its histories start empty.
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
rm -rf "$out"/fp8_*.h5 "$out"/fp8_*.h5.tmp "$out"/fp8_ckptdir
run() {   # run NP NAME ARGS...
  local np=$1 name=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --allow-run-as-root -np "$np" "$lmscale" "$deck" --run.output="$out/fp8_$name.h5" "$@" \
      > "$out/fp8_$name.log" 2>&1
  else
    "$lmscale" "$deck" --run.output="$out/fp8_$name.h5" "$@" > "$out/fp8_$name.log" 2>&1
  fi
}
run 1 fp32 --precision.mode=fp32
for scaling in current delayed; do
  run 1 "${scaling}_none" --precision.fp8_scaling=$scaling
  run 1 "${scaling}_every1" --precision.fp8_scaling=$scaling --train.activation_checkpointing=every-k
  run 1 "${scaling}_every2_keep_attention" --precision.fp8_scaling=$scaling --train.activation_checkpointing=every-k \
      --train.checkpoint_k=2 --train.checkpoint_keep_attention=true --model.attention=flash
  run 1 "${scaling}_flash" --precision.fp8_scaling=$scaling --model.attention=flash
  run 1 "${scaling}_selective" --precision.fp8_scaling=$scaling --train.activation_checkpointing=selective
  run 1 "${scaling}_selective_mlp" --precision.fp8_scaling=$scaling --train.activation_checkpointing=selective-mlp
done
run 1 delayed_eval --precision.fp8_scaling=delayed --train.eval_every=3
# precision.fp8_fast_accum: the CPU emulation ignores it (the default is forward).
run 1 current_fast_all --precision.fp8_fast_accum=all
run 1 current_fast_none --precision.fp8_fast_accum=none
run 1 current_accum2 --train.grad_accum=2
run 2 ddp --parallel.ddp=flat
run 2 zero2 --parallel.ddp=bucketed --parallel.zero=zero2 --parallel.bucket_mb=0.01
run 2 fsdp --parallel.zero=fsdp
run 2 fsdp_offload --parallel.zero=fsdp --parallel.offload=optimizer
# fsdp's FP8 weight gathers (parallel.fsdp_gather_dtype = fp8) against its compute-dtype gathers,
# bitwise: on 2 ranks, with activation checkpointing (the replay), without resharding, with both
# offload modes, and on 4 ranks against fsdp on 4 (both then against one process, grad_accum 4).
run 2 fsdp_gfp8 --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8
run 2 fsdp_gfp8_every1 --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8 --train.activation_checkpointing=every-k
run 2 fsdp_gfp8_selective_mlp --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8 \
    --train.activation_checkpointing=selective-mlp
run 2 fsdp_gfp8_keep --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8 --parallel.reshard_after_forward=false
run 2 fsdp_gfp8_offload --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8 --parallel.offload=optimizer
run 2 fsdp_offload_params --parallel.zero=fsdp --parallel.offload=optimizer+params
run 2 fsdp_gfp8_offload_params --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8 --parallel.offload=optimizer+params
run 4 fsdp4 --parallel.zero=fsdp
run 4 fsdp4_gfp8 --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8
run 1 current_accum4 --train.grad_accum=4
# Current scaling holds no state between casts: a checkpoint at step 6 resumed to 12 equals the
# uninterrupted run bitwise.
run 1 resume_a --train.steps=6 --train.checkpoint_every=6 --optim.cosine_steps=12 --train.checkpoint_path="$out/fp8_ckpt.h5"
run 1 resume_b --train.steps=12 --train.resume="$out/fp8_ckpt.h5" --optim.cosine_steps=12 \
    --train.checkpoint_path="$out/fp8_ckpt2.h5"
# Delayed scaling keeps state between casts: the checkpoints hold every rank's (fp8_check.py
# compares each resumed run with the uninterrupted one).
D=(--precision.fp8_scaling=delayed --optim.cosine_steps=12)
run 1 resume_d_a "${D[@]}" --train.steps=6 --train.checkpoint_every=6 --train.checkpoint_path="$out/fp8_ckpt_d.h5"
run 1 resume_d_b "${D[@]}" --train.steps=12 --train.resume="$out/fp8_ckpt_d.h5" --train.checkpoint_path="$out/fp8_ckpt_d2.h5"
# A window of 4 casts wraps before and after the checkpoint, so amaxes are evicted on both sides.
run 1 delayed_h4 "${D[@]}" --precision.fp8_history=4
run 1 resume_h4_a "${D[@]}" --precision.fp8_history=4 --train.steps=6 --train.checkpoint_every=6 \
    --train.checkpoint_path="$out/fp8_ckpt_h4.h5"
run 1 resume_h4_b "${D[@]}" --precision.fp8_history=4 --train.steps=12 --train.resume="$out/fp8_ckpt_h4.h5" \
    --train.checkpoint_path="$out/fp8_ckpt_h4b.h5"
# Another window length than the checkpoint's: no state for it, and a warning.
run 1 resume_h8 "${D[@]}" --precision.fp8_history=8 --train.steps=8 --train.resume="$out/fp8_ckpt_h4.h5" \
    --train.checkpoint_path="$out/fp8_ckpt_h8.h5"
run 2 delayed_ddp "${D[@]}" --parallel.ddp=flat
run 2 resume_d2_a "${D[@]}" --parallel.ddp=flat --train.steps=6 --train.checkpoint_every=6 \
    --train.checkpoint_path="$out/fp8_ckpt_d2r.h5"
run 2 resume_d2_b "${D[@]}" --parallel.ddp=flat --train.steps=12 --train.resume="$out/fp8_ckpt_d2r.h5" \
    --train.checkpoint_path="$out/fp8_ckpt_d2r2.h5"
run 2 resume_ds_a "${D[@]}" --parallel.ddp=flat --train.steps=6 --train.checkpoint_every=6 \
    --train.checkpoint_dir="$out/fp8_ckptdir"
run 2 resume_ds_b "${D[@]}" --parallel.ddp=flat --train.steps=12 --train.resume=auto \
    --train.checkpoint_dir="$out/fp8_ckptdir"
# Resumed on 1 rank from the 2 ranks' checkpoints: no state for this layout, and a warning.
run 1 resume_ds_1 "${D[@]}" --train.steps=8 --train.resume="$out/fp8_ckptdir/step_00000006"
run 1 resume_d2_1 "${D[@]}" --train.steps=8 --train.resume="$out/fp8_ckpt_d2r.h5" \
    --train.checkpoint_path="$out/fp8_ckpt_d2r_1.h5"
for name in resume_ds_1 resume_d2_1 resume_h8; do
  if ! grep -q "starts the amax histories empty" "$out/fp8_$name.log"; then
    echo "FAIL  $name: resuming delayed scaling state of another rank count or window did not warn"
    exit 1
  fi
done
# A damaged state (a NaN scale) is refused with exit 2 before any step.
python3 - "$out/fp8_ckpt_d.h5" "$out/fp8_ckpt_bad.h5" <<'DAMAGE'
import shutil, sys, h5py
shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "a") as f:
    f["state/fp8_scale"][0, 3] = float("nan")
DAMAGE
set +e
"$lmscale" "$deck" "${D[@]}" --train.steps=12 --train.resume="$out/fp8_ckpt_bad.h5" --run.output="$out/fp8_bad.h5" \
    > "$out/fp8_bad.log" 2>&1
rc=$?
set -e
if [ "$rc" -ne 2 ] || ! grep -q "state is damaged" "$out/fp8_bad.log"; then
  echo "FAIL  a NaN FP8 scale in the checkpoint: exit $rc, expected 2 naming the damage"
  exit 1
fi
for name in resume_d_b resume_h4_b resume_d2_b resume_ds_b; do
  if grep -q "starts the amax histories empty" "$out/fp8_$name.log"; then
    echo "FAIL  $name: warned that the histories start empty, but the checkpoint holds them"
    exit 1
  fi
done
python3 "$here/fp8_check.py" "$out"
