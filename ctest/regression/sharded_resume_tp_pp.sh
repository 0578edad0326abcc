#!/usr/bin/env bash
# sharded_resume_tp_pp.sh LMSCALE DECK OUTDIR
# Sharded checkpoints of tensor- and pipeline-parallel layouts (docs/checkpoints.md "Ownership"),
# tiny regression deck (tiny_train_tp.ini: vocab 96 divisible by tp), 12 steps, checkpoint at 6:
#   tp  tp = 2 with sequence parallelism: resumed at 6 in the same layout -> bitwise; in one
#       process -> within RESHARD_RTOL of the tp run (reduction order)
#   dt  dp 2 x tp 2, zero2 (4 ranks): same layout -> bitwise; tp = 2 without dp -> within tolerance
#   pp  pp = 2 (1f1b, 2 microbatches): same layout -> bitwise; one process -> within tolerance
#   dpp dp 2 x pp 2, zero1 (gpipe, 4 ranks): same layout -> bitwise; pp = 2 -> within tolerance
#   tpp tp 2 x pp 2 with sequence parallelism (1f1b, 4 ranks): same layout -> bitwise; one
#       process -> within tolerance
#   one one process's checkpoint -> resumed by tp = 2, by pp = 2 and by tp 2 x pp 2 (the reverse)
#       within tolerance
# Each checkpoint's index checks that its pieces cover every parameter exactly once (a row-
# parallel slice is one piece per row: a wrong element range fails there or in the losses).
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmp="python3 $here/compare_losses.py"
rtol=${RESHARD_RTOL:-2e-5}   # as tp_check.sh / pp_save_check.sh: summation order only
rm -rf "$out/sharded_tp_pp"; mkdir -p "$out/sharded_tp_pp"; cd "$out/sharded_tp_pp"
mpi() { local np=$1; shift; mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" "$lmscale" "$deck" "$@"; }
common=(--optim.cosine_steps=12 --train.steps=12)
# NAME: the uninterrupted run's first 6 steps as a results file (to compare resumed parts with).
prefix() {
  python3 - "$1" <<'PY'
import h5py, sys
n = sys.argv[1]
with h5py.File(f"{n}.h5") as a, h5py.File(f"{n}6.h5", "w") as o:
    o["/train/steps"] = a["/train/steps"][:6]
PY
}
# writer NAME NP ARGS...: the uninterrupted run with checkpoints at 6 and 12
writer() {
  local name=$1 np=$2; shift 2
  mpi "$np" "${common[@]}" "$@" --run.output="$name.h5" --train.checkpoint_dir="ck_$name" --train.checkpoint_every=6
  [[ -f ck_$name/step_00000006/index.h5 ]] || { echo "FAIL: $name: no checkpoint at step 6"; exit 1; }
  prefix "$name"
}
# resume REF NAME NP RTOL ARGS...: resumes REF's step-6 checkpoint, compares with REF's losses
resume() {
  local ref=$1 name=$2 np=$3 tol=$4; shift 4
  mpi "$np" "${common[@]}" "$@" --run.output="$name.h5" --train.resume="ck_$ref/step_00000006"
  $cmp "$ref.h5" "$tol" "${ref}6.h5" "$name.h5" || { echo "FAIL: $ref -> $name (rtol $tol)"; exit 1; }
  echo "ok: $ref -> $name ($([[ $tol == 0 ]] && echo bitwise || echo "rtol $tol"))"
}

tp=(--parallel.tp=2 --parallel.sequence_parallel=true)
writer tp 2 "${tp[@]}"
resume tp tp_same 2 0 "${tp[@]}"
resume tp tp_to_one 1 "$rtol"

dt=(--parallel.tp=2 --parallel.zero=zero2)
writer dt 4 "${dt[@]}"
resume dt dt_same 4 0 "${dt[@]}"
resume dt dt_to_tp 2 "$rtol" --parallel.tp=2

pp=(--parallel.pp=2 --parallel.microbatches=2 --parallel.schedule=1f1b)
writer pp 2 "${pp[@]}"
resume pp pp_same 2 0 "${pp[@]}"
resume pp pp_to_one 1 "$rtol"

dpp=(--parallel.pp=2 --parallel.microbatches=2 --parallel.schedule=gpipe --parallel.zero=zero1)
writer dpp 4 "${dpp[@]}"
resume dpp dpp_same 4 0 "${dpp[@]}"
resume dpp dpp_to_pp 2 "$rtol" --parallel.pp=2 --parallel.microbatches=2

tpp=(--parallel.tp=2 --parallel.pp=2 --parallel.microbatches=2 --parallel.schedule=1f1b
     --parallel.sequence_parallel=true)
writer tpp 4 "${tpp[@]}"
resume tpp tpp_same 4 0 "${tpp[@]}"
resume tpp tpp_to_one 1 "$rtol"

writer one 1
resume one one_to_tp 2 "$rtol" --parallel.tp=2
resume one one_to_pp 2 "$rtol" --parallel.pp=2 --parallel.microbatches=2
resume one one_to_tpp 4 "$rtol" "${tpp[@]}"
python3 - <<'PY'
import h5py
with h5py.File("ck_tp/step_00000006/index.h5") as f:
    print("tp = 2 checkpoint:", len(f["pieces/param"]), "pieces over", len(f["params/name"]), "parameters;",
          f.attrs["writer_layout"].decode() if isinstance(f.attrs["writer_layout"], bytes) else f.attrs["writer_layout"])
PY
echo PASS
