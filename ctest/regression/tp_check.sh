#!/usr/bin/env bash
# tp_check.sh LMSCALE CHECK_TABLE DECK GOLDEN OUTDIR
# Tensor parallelism through the executable, against the losses of one process (GOLDEN, from
# tiny_train_tp.ini): tp = 2, tp = 2 with sequence parallelism and dp 2 x tp 2 (zero1) log the same
# losses; a checkpoint written by a tp = 2 run (full parameters and AdamW moments by name) resumes
# in one process, and one process's checkpoint resumes under tp = 2 with sequence parallelism,
# both continuing with the uninterrupted run's losses; train.save of a tp = 2 run holds every
# parameter by name at its full shape, equal to one process's (h5diff). Tensor x pipeline: tp 2 x
# pp 2 (4 ranks; gpipe, and 1f1b with sequence parallelism, 2 microbatches) logs the same losses,
# and its train.save (slices gathered over tp, then stages over pp) equals one process's weights;
# single-file checkpoints resume from tp 2 x pp 2 in one process and back.
set -euo pipefail
lmscale=$1 check=$2 deck=$3 golden=$4 out=$5
mkdir -p "$out"
rm -f "$out"/tp_*
mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none)
rtol=${RTOL:-2e-5}
run() {   # run NP NAME ARGS...
  local np=$1 name=$2
  shift 2
  "${mpi[@]}" -np "$np" "$lmscale" "$deck" --run.output="$out/tp_$name.h5" "$@"
}
run 2 tp2 --parallel.tp=2 --train.save="$out/tp_tp2_weights.h5"
"$check" "$out/tp_tp2.h5" /train/steps loss "$golden" "$rtol"
run 2 tp2_sp --parallel.tp=2 --parallel.sequence_parallel=true
"$check" "$out/tp_tp2_sp.h5" /train/steps loss "$golden" "$rtol"
run 4 dp2_tp2 --parallel.tp=2 --parallel.zero=zero1
"$check" "$out/tp_dp2_tp2.h5" /train/steps loss "$golden" "$rtol"
tpp=(--parallel.tp=2 --parallel.pp=2 --parallel.microbatches=2)
run 4 tp2_pp2 "${tpp[@]}" --parallel.schedule=gpipe
"$check" "$out/tp_tp2_pp2.h5" /train/steps loss "$golden" "$rtol"
run 4 tp2_pp2_sp "${tpp[@]}" --parallel.schedule=1f1b --parallel.sequence_parallel=true \
  --train.save="$out/tp_tp2_pp2_weights.h5"
"$check" "$out/tp_tp2_pp2_sp.h5" /train/steps loss "$golden" "$rtol"

# Resume across layouts: the first 6 steps in one layout, the last 6 in another.
grep -v '^#' "$golden" | head -n 6 > "$out/tp_golden_a.txt"
grep -v '^#' "$golden" | tail -n 6 > "$out/tp_golden_b.txt"
common=(--optim.cosine_steps=12)
run 2 resume_a --parallel.tp=2 --train.steps=6 --train.checkpoint_every=6 \
  --train.checkpoint_path="$out/tp_ckpt_tp2.h5" "${common[@]}"
"$check" "$out/tp_resume_a.h5" /train/steps loss "$out/tp_golden_a.txt" "$rtol"
"$lmscale" "$deck" --run.output="$out/tp_resume_b.h5" --train.resume="$out/tp_ckpt_tp2.h5" \
  --train.checkpoint_path="$out/tp_ckpt_b.h5" "${common[@]}"
"$check" "$out/tp_resume_b.h5" /train/steps loss "$out/tp_golden_b.txt" "$rtol"
"$lmscale" "$deck" --run.output="$out/tp_resume_c.h5" --train.steps=6 --train.checkpoint_every=6 \
  --train.checkpoint_path="$out/tp_ckpt_one.h5" "${common[@]}"
run 2 resume_d --parallel.tp=2 --parallel.sequence_parallel=true --train.resume="$out/tp_ckpt_one.h5" \
  --train.checkpoint_path="$out/tp_ckpt_d.h5" "${common[@]}"
"$check" "$out/tp_resume_d.h5" /train/steps loss "$out/tp_golden_b.txt" "$rtol"
# The same single-file checkpoint (parameters and moments gathered over tp, then pp) from tp 2 x
# pp 2 to one process, and one process's into tp 2 x pp 2 with sequence parallelism.
tpp_sp=(--parallel.tp=2 --parallel.pp=2 --parallel.microbatches=2 --parallel.sequence_parallel=true)
run 4 resume_e "${tpp_sp[@]}" --train.steps=6 --train.checkpoint_every=6 \
  --train.checkpoint_path="$out/tp_ckpt_tpp.h5" "${common[@]}"
"$check" "$out/tp_resume_e.h5" /train/steps loss "$out/tp_golden_a.txt" "$rtol"
"$lmscale" "$deck" --run.output="$out/tp_resume_f.h5" --train.resume="$out/tp_ckpt_tpp.h5" \
  --train.checkpoint_path="$out/tp_ckpt_f.h5" "${common[@]}"
"$check" "$out/tp_resume_f.h5" /train/steps loss "$out/tp_golden_b.txt" "$rtol"
run 4 resume_g "${tpp_sp[@]}" --train.resume="$out/tp_ckpt_one.h5" --train.checkpoint_path="$out/tp_ckpt_g.h5" \
  "${common[@]}"
"$check" "$out/tp_resume_g.h5" /train/steps loss "$out/tp_golden_b.txt" "$rtol"
# train.save of the tp = 2 run: every parameter by name at its full shape, equal to one process's
# weights within 1e-5 (h5diff fails on a missing name, another shape or a larger difference).
"$lmscale" "$deck" --run.output="$out/tp_one.h5" --train.save="$out/tp_one_weights.h5"
names=$(h5ls "$out/tp_one_weights.h5" | awk '{print $1}')
[ "$(echo "$names" | wc -l)" -eq 21 ] || { echo "FAIL: expected 21 parameters, got: $names"; exit 1; }
for name in $names; do
  for w in tp_tp2_weights tp_tp2_pp2_weights; do
    h5diff -d 1e-5 "$out/tp_one_weights.h5" "$out/$w.h5" "/$name" || { echo "FAIL: $w: $name differs"; exit 1; }
  done
done
echo "tensor-parallel regression: all checks passed"
