#!/usr/bin/env bash
# tp_fsdp_check.sh LMSCALE CHECK_TABLE DECK GOLDEN OUTDIR
# 2D parallelism (fsdp over the dp axis of dp 2 x tp 2, 4 ranks) through the executable, with
# tiny_train_tp.ini and one process's losses (GOLDEN):
#   - dp 2 x tp 2 fsdp, with and without sequence parallelism, log the golden losses (RTOL);
#   - its train.save holds every parameter by name at its full shape, equal to one process's file
#     (h5diff -d 1e-5): gathered over dp, then the tp slices put at their full-model places;
#   - sharded checkpoints (train.checkpoint_dir, step 6 of 12): resumed in the same layout ->
#     bitwise; in one process and under dp 2 x tp 2 zero2 -> within RTOL; one process's checkpoint
#     resumed under dp 2 x tp 2 fsdp + sp -> within RTOL (pieces in full-model coordinates: a
#     wrong range fails the index's coverage check or the losses);
#   - what stays unbuilt is refused with exit 2 naming the key: single-file checkpoints with
#     optimizer state (train.checkpoint_every without train.checkpoint_dir), and resuming one.
set -euo pipefail
lmscale=$1 check=$2 deck=$3 golden=$4 out=$5
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmp="python3 $here/compare_losses.py"
rtol=${RTOL:-2e-5}   # as tp_check.sh: summation order only
rm -rf "$out/fsdp_2d"; mkdir -p "$out/fsdp_2d"; cd "$out/fsdp_2d"   # (tp_check.sh removes $out/tp_*)
mpi() { local np=$1; shift; mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" "$lmscale" "$deck" "$@"; }
dtf=(--parallel.tp=2 --parallel.zero=fsdp)

mpi 4 "${dtf[@]}" --run.output=dtf.h5 --train.save=dtf_weights.h5
"$check" dtf.h5 /train/steps loss "$golden" "$rtol"
mpi 4 "${dtf[@]}" --parallel.sequence_parallel=true --run.output=dtf_sp.h5
"$check" dtf_sp.h5 /train/steps loss "$golden" "$rtol"
echo "ok: dp 2 x tp 2 fsdp (with and without sp) log the golden losses"

"$lmscale" "$deck" --run.output=one.h5 --train.save=one_weights.h5
names=$(h5ls one_weights.h5 | awk '{print $1}')
[ "$(echo "$names" | wc -l)" -eq 21 ] || { echo "FAIL: expected 21 parameters, got: $names"; exit 1; }
[ "$(h5ls dtf_weights.h5 | wc -l)" -eq 21 ] || { echo "FAIL: dtf_weights.h5 does not hold 21 parameters"; exit 1; }
for name in $names; do
  h5diff -d 1e-5 one_weights.h5 dtf_weights.h5 "/$name" || { echo "FAIL: $name differs"; exit 1; }
done
echo "ok: train.save of dp 2 x tp 2 fsdp = one process's weights by name"

# Sharded checkpoints across layouts.
common=(--optim.cosine_steps=12 --train.steps=12)
prefix() {   # NAME: the uninterrupted run's first 6 steps as NAME6.h5
  python3 - "$1" <<'PY'
import h5py, sys
n = sys.argv[1]
with h5py.File(f"{n}.h5") as a, h5py.File(f"{n}6.h5", "w") as o:
    o["/train/steps"] = a["/train/steps"][:6]
PY
}
writer() {   # NAME NP ARGS...
  local name=$1 np=$2; shift 2
  mpi "$np" "${common[@]}" "$@" --run.output="ck_$name.h5" --train.checkpoint_dir="ck_$name" --train.checkpoint_every=6
  [[ -f ck_$name/step_00000006/index.h5 ]] || { echo "FAIL: $name: no checkpoint at step 6"; exit 1; }
  prefix "ck_$name"
}
resume() {   # REF NAME NP RTOL ARGS...
  local ref=$1 name=$2 np=$3 tol=$4; shift 4
  mpi "$np" "${common[@]}" "$@" --run.output="$name.h5" --train.resume="ck_$ref/step_00000006"
  $cmp "ck_$ref.h5" "$tol" "ck_${ref}6.h5" "$name.h5" || { echo "FAIL: $ref -> $name (rtol $tol)"; exit 1; }
  echo "ok: $ref -> $name ($([[ $tol == 0 ]] && echo bitwise || echo "rtol $tol"))"
}
writer dtf 4 "${dtf[@]}" --parallel.sequence_parallel=true
resume dtf dtf_same 4 0 "${dtf[@]}" --parallel.sequence_parallel=true
resume dtf dtf_to_one 1 "$rtol"
resume dtf dtf_to_zero2 4 "$rtol" --parallel.tp=2 --parallel.zero=zero2
writer one 1
resume one one_to_dtf 4 "$rtol" "${dtf[@]}" --parallel.sequence_parallel=true

# Unbuilt: refused with exit 2 before any step, naming the key.
refused() {   # KEY NP ARGS...
  local key=$1 np=$2; shift 2
  set +e
  mpi "$np" "$@" > refused.log 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || { echo "FAIL: exit $rc (expected 2) for $*"; cat refused.log; exit 1; }
  grep 'lmscale: error:' refused.log | grep -qF -- "$key" || { echo "FAIL: no error naming $key"; cat refused.log; exit 1; }
  echo "ok: refused (exit 2, names $key): $*"
}
refused train.checkpoint_every 4 "${dtf[@]}" --run.output=r1.h5 --train.checkpoint_every=6 --train.checkpoint_path=ck.h5
"$lmscale" "$deck" --run.output=single.h5 --train.steps=3 --train.checkpoint_every=3 --train.checkpoint_path=single_ck.h5
refused train.resume 4 "${dtf[@]}" --run.output=r2.h5 --train.resume=single_ck.h5
echo "tp x fsdp regression: all checks passed"
