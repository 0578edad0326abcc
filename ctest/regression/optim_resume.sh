#!/usr/bin/env bash
# optim_resume.sh LMSCALE DECK OUTDIR
# SGD, LARS and LAMB through the executable and both checkpoint formats (issue 16):
#   for each optimizer: A the uninterrupted 12 steps (one process);
#   B one process, single-file checkpoint at step 6, resumed -> losses bitwise A's;
#   C zero2 on 2 ranks, sharded checkpoint at step 6, resumed on zero2 -> bitwise its own run;
#     resumed as fsdp on 2 ranks (resharded by name) -> within RTOL of that run;
#   D a lamb checkpoint resumed with optim.name = sgd (single file and sharded) -> exit 2 naming
#     optim.name, no results file;
#   E bad optimizer values -> exit 2 (the deck tests cover each key; here one through mpirun).
# Also: the effective LR of optim.reference_batch is printed and stored (/train lr_effective).
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmp="python3 $here/compare_losses.py"
rtol=${RESHARD_RTOL:-1e-5}
rm -rf "$out/optim"; mkdir -p "$out/optim"; cd "$out/optim"
mpi() { local np=$1; shift; mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" "$lmscale" "$deck" "$@"; }
common=(--optim.cosine_steps=12)
for opt in sgd lars lamb; do
  case $opt in
    sgd) o=(--optim.name=sgd --optim.lr=0.2 --optim.min_lr=0.02 --optim.nesterov=true) ;;
    lars) o=(--optim.name=lars --optim.lr=5 --optim.min_lr=0.5 --optim.trust_coefficient=0.02) ;;
    lamb) o=(--optim.name=lamb --optim.lr=2e-2 --optim.min_lr=2e-3) ;;
  esac
  "$lmscale" "$deck" "${common[@]}" "${o[@]}" --train.steps=12 --run.output=${opt}_A.h5 > ${opt}_A.log
  "$lmscale" "$deck" "${common[@]}" "${o[@]}" --train.steps=6 --train.checkpoint_every=6 \
    --train.checkpoint_path=${opt}_ck.h5 --run.output=${opt}_B1.h5 > /dev/null
  "$lmscale" "$deck" "${common[@]}" "${o[@]}" --train.resume=${opt}_ck.h5 --train.checkpoint_path=${opt}_ck2.h5 \
    --train.steps=12 --run.output=${opt}_B2.h5 > /dev/null
  $cmp ${opt}_A.h5 0 ${opt}_B1.h5 ${opt}_B2.h5
  echo "ok: $opt single-file resume is bitwise"
  mpi 2 "${common[@]}" "${o[@]}" --parallel.zero=zero2 --train.checkpoint_dir=ck_$opt --train.checkpoint_every=6 \
    --run.output=${opt}_C.h5 > /dev/null
  mpi 2 "${common[@]}" "${o[@]}" --parallel.zero=zero2 --train.resume=ck_$opt/step_00000006 --run.output=${opt}_C2.h5 > /dev/null
  python3 - ${opt}_C.h5 6 <<'PY'
import h5py, sys
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[1].replace(".h5", "6.h5"), "w") as o:
    o.create_dataset("/train/steps", data=a["/train/steps"][: int(sys.argv[2])])
PY
  $cmp ${opt}_C.h5 0 ${opt}_C6.h5 ${opt}_C2.h5
  mpi 2 "${common[@]}" "${o[@]}" --parallel.zero=fsdp --parallel.ddp=none --train.resume=ck_$opt/step_00000006 \
    --run.output=${opt}_E.h5 > /dev/null
  $cmp ${opt}_C.h5 "$rtol" ${opt}_C6.h5 ${opt}_E.h5
  echo "ok: $opt sharded resume bitwise on zero2, resharded to fsdp within $rtol"
done

# D: another optimizer's state is refused, naming optim.name, before any output.
for ck in lamb_ck.h5 ck_lamb/step_00000006; do
  set +e
  "$lmscale" "$deck" "${common[@]}" --optim.name=sgd --train.resume=$ck --run.output=D.h5 > D.log 2>&1
  rc=$?
  set -e
  [[ $rc == 2 ]] || { echo "FAIL: resuming lamb state as sgd gave exit $rc"; cat D.log; exit 1; }
  grep -q "optim.name" D.log || { echo "FAIL: the error does not name optim.name"; cat D.log; exit 1; }
  [[ ! -e D.h5 ]] || { echo "FAIL: a results file was written"; exit 1; }
done
echo "ok: another optimizer's checkpoint is refused with exit 2"

# The linear scaling rule: printed and stored.
"$lmscale" "$deck" --train.steps=4 --optim.reference_batch=2 --run.output=R.h5 --run.progress=true > R.log
grep -q "optimizer: adamw, lr 4.000e-02 (min 4.000e-03) = 1.000e-02 x 8 / reference_batch 2" R.log ||
  { echo "FAIL: effective LR line"; grep optimizer R.log; exit 1; }
python3 - <<'PY'
import h5py, sys
with h5py.File("R.h5") as f:
    a = f["/train"].attrs
    assert abs(a["lr_effective"] - 0.04) < 1e-12 and a["lr_scale"] == 4.0, dict(a)
    lr = f["/train/steps"]["lr"]
    # warm-up of 3 steps (the deck) toward the scaled peak: step 1 runs at 0.04 / 3
    assert abs(lr[1] - 0.04 / 3) < 1e-9, lr[1]
PY
echo "ok: reference_batch scales the LR, printed and stored"
