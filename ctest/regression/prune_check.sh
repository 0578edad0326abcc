#!/usr/bin/env bash
# run.job = prune on CPU: train a tiny model and save its weights; prune it
# (1) unstructured, fixed schedule, to sparsity 0.75: the exported file has exactly
#     round(0.75 n) zeros among the n attention/FFN matrix weights and nothing else changed shape;
# (2) structured, fixed schedule, to 0.5 of the FFN units: every round's physically smaller model
#     evaluates to the masked model's loss (rel 1e-5), the export has d_ff = F/2 and `train`
#     resumes from it with model.d_ff = F/2 (and refuses it, exit 2 naming model.d_ff, without);
# (3) loss-guided with a tight bound stops at a round within the bound.
# Usage: prune_check.sh LMSCALE SOURCE_DIR OUT_DIR
set -eu
lmscale=$1
src=$2
out=$3
rm -rf "$out"
mkdir -p "$out"
deck=$src/ctest/regression/tiny_train.ini
base=(--train.steps=30 --train.eval_batches=2)
common=(--model.d_ff=64 "${base[@]}")
"$lmscale" "$deck" "${common[@]}" --run.output="$out/train.h5" --train.save="$out/w.h5"

"$lmscale" "$deck" "${common[@]}" --run.job=prune --run.output="$out/u.h5" --prune.weights="$out/w.h5" \
  --prune.target_sparsity=0.75 --prune.theta=4 --prune.finetune_steps=3 --prune.output="$out/u_w.h5"
"$lmscale" "$deck" "${common[@]}" --run.job=prune --run.output="$out/s.h5" --prune.weights="$out/w.h5" \
  --prune.method=structured --prune.target_sparsity=0.5 --prune.theta=4 --prune.finetune_steps=3 \
  --prune.output="$out/s_w.h5"
# (4) the same structured run on 2 data-parallel ranks and with 2 pipeline stages: the masks go
#     through the trainer's full-parameter gather/scatter, so the rounds match one process.
for layout in --parallel.ddp=bucketed --parallel.pp=2; do
  mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 "$lmscale" "$deck" "${common[@]}" --run.job=prune \
    --run.output="$out/s_np2${layout##*.}.h5" --prune.weights="$out/w.h5" --prune.method=structured \
    --prune.target_sparsity=0.5 --prune.theta=4 --prune.finetune_steps=3 "$layout"
done
"$lmscale" "$deck" "${common[@]}" --run.job=prune --run.output="$out/g.h5" --prune.weights="$out/w.h5" \
  --prune.schedule=loss-guided --prune.target_sparsity=0.99 --prune.theta=2 --prune.finetune_steps=2 \
  --prune.max_loss_increase=0.25

set +e
"$lmscale" "$deck" "${common[@]}" --run.output="$out/r_bad.h5" --train.resume="$out/s_w.h5" 2>"$out/r_bad.err"
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "FAIL: resuming the d_ff 32 export with d_ff 64 gave exit $rc, not 2"; exit 1; }
grep -q "model.d_ff = 32" "$out/r_bad.err" || { echo "FAIL: no hint to set model.d_ff = 32"; cat "$out/r_bad.err"; exit 1; }
"$lmscale" "$deck" --model.d_ff=32 --train.steps=4 --run.output="$out/r.h5" --train.resume="$out/s_w.h5"

python3 "$src/ctest/regression/prune_check.py" "$out"
# The analysis tables and plots of the rounds (one file each and the comparison).
MPLBACKEND=Agg PYTHONPATH="$src" python3 -m analysis.report "$out/u.h5" "$out/s.h5" --out "$out/report" --format md,png
for f in u.prune_rounds.md s.prune_rounds.md u.prune.png s.prune.png; do
  [ -s "$out/report/$f" ] || { echo "FAIL: analysis.report wrote no $f"; ls "$out/report"; exit 1; }
done
grep -q "export val loss" "$out/report/s.prune_rounds.md" || { echo "FAIL: structured table lacks the export column"; exit 1; }
echo "prune_check passed"
