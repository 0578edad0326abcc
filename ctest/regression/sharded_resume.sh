#!/usr/bin/env bash
# sharded_resume.sh LMSCALE DECK OUTDIR
# Sharded checkpoints (docs/checkpoints.md) on the tiny regression deck:
#   A  zero2 on 2 ranks, 12 steps, checkpoint every 6 (step 6 and 12) = the uninterrupted run
#   B  zero2 on 2 resumes step 6 -> its losses equal A's bitwise (same layout)
#   C  ddp on 4 resumes step 6 (resharded by name) -> within RESHARD_RTOL of A
#   D  one process resumes step 6 -> within RESHARD_RTOL
#   E  fsdp on 2 resumes step 6 -> within RESHARD_RTOL
#   E2 fsdp on 2 from the start, checkpoint every 3, keep_checkpoints = 2 -> steps 9, 12 left;
#   F  one process resumes fsdp's step 9 -> within RESHARD_RTOL; a finished run resumed: exit 0
#   G  mismatched model (d_ff), incomplete (no index), damaged rank file (bytes overwritten;
#      truncated) -> exit 2 naming the file, no results file written
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmp="python3 $here/compare_losses.py"
rtol=${RESHARD_RTOL:-1e-5}
rm -rf "$out/sharded"; mkdir -p "$out/sharded"; cd "$out/sharded"
mpi() { local np=$1; shift; mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" "$lmscale" "$deck" "$@"; }
common=(--optim.cosine_steps=12 --train.steps=12)

mpi 2 "${common[@]}" --parallel.zero=zero2 --run.output=A.h5 --train.checkpoint_dir=ckA --train.checkpoint_every=6
[[ -f ckA/step_00000006/index.h5 && -f ckA/step_00000012/index.h5 ]] || { echo "FAIL: A's checkpoints missing"; exit 1; }
[[ -f ckA/step_00000006/rank_00000.h5 && -f ckA/step_00000006/rank_00001.h5 ]] || { echo "FAIL: rank files missing"; exit 1; }

mpi 2 "${common[@]}" --parallel.zero=zero2 --run.output=B.h5 --train.resume=ckA/step_00000006
python3 - <<'PY'
import h5py, sys
with h5py.File("A.h5") as a, h5py.File("B.h5") as b:
    la, lb = a["/train/steps"]["loss"], b["/train/steps"]["loss"]
    assert len(lb) == 6, len(lb)
    sys.exit(0 if list(la[6:]) == list(lb) else f"FAIL: zero2 resume not bitwise: {list(la[6:])} vs {list(lb)}")
PY
echo "ok: zero2 -> zero2 resume is bitwise"

prefix() {  # N: A's first N steps as a results file, to compare a resumed part against the whole run
  python3 - "$1" <<'PY'
import h5py, sys
n = int(sys.argv[1])
with h5py.File("A.h5") as a, h5py.File(f"A{n}.h5", "w") as o:
    o["/train/steps"] = a["/train/steps"][:n]
PY
}
prefix 6; prefix 9
mpi 4 "${common[@]}" --parallel.ddp=bucketed --run.output=C.h5 --train.resume=ckA/step_00000006
$cmp A.h5 "$rtol" A6.h5 C.h5
echo "ok: zero2 on 2 -> ddp on 4"
"$lmscale" "$deck" "${common[@]}" --run.output=D.h5 --train.resume=ckA/step_00000006
$cmp A.h5 "$rtol" A6.h5 D.h5
echo "ok: zero2 on 2 -> one process"
mpi 2 "${common[@]}" --parallel.zero=fsdp --run.output=E.h5 --train.resume=ckA/step_00000006
$cmp A.h5 "$rtol" A6.h5 E.h5
echo "ok: zero2 on 2 -> fsdp on 2"
mpi 2 "${common[@]}" --parallel.zero=fsdp --run.output=E2.h5 --train.checkpoint_dir=ckE --train.checkpoint_every=3 \
  --train.keep_checkpoints=2
[[ $(ls ckE | tr '\n' ' ') == "step_00000009 step_00000012 " ]] || { echo "FAIL: keep_checkpoints = 2 left: $(ls ckE)"; exit 1; }
"$lmscale" "$deck" "${common[@]}" --run.output=F.h5 --train.resume=ckE/step_00000009
$cmp A.h5 "$rtol" A9.h5 F.h5
echo "ok: fsdp on 2 -> one process; keep_checkpoints = 2 kept the newest two"
# A finished run resumed again (a requeued job that had completed): nothing to do, exit 0.
"$lmscale" "$deck" "${common[@]}" --run.output=F2.h5 --train.resume=auto --train.checkpoint_dir=ckE

expect2() {  # WHAT PATTERN ARGS...: exit 2, the message matches PATTERN, no results file
  local what=$1 pattern=$2 rc=0; shift 2
  rm -f G.h5
  mpi 2 "${common[@]}" --parallel.zero=zero2 --run.output=G.h5 "$@" > G.log 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || { cat G.log; echo "FAIL: $what: exit $rc, expected 2"; exit 1; }
  grep -q -- "$pattern" G.log || { cat G.log; echo "FAIL: $what: message lacks '$pattern'"; exit 1; }
  [[ ! -e G.h5 && ! -e G.h5.tmp ]] || { echo "FAIL: $what: a results file was written"; exit 1; }
  echo "ok: $what -> exit 2: $(grep -m1 error G.log)"
}
expect2 "another model (d_ff)" "d_ff" --train.resume=ckA/step_00000006 --model.d_ff=96
cp -r ckA/step_00000006 incomplete; rm incomplete/index.h5
expect2 "incomplete checkpoint" "index.h5" --train.resume=incomplete
cp -r ckA/step_00000006 damaged
size=$(stat -c %s damaged/rank_00001.h5)
python3 - damaged/rank_00001.h5 <<'PY'   # garbage over the middle half of the file
import sys
p = sys.argv[1]
with open(p, "r+b") as f:
    n = f.seek(0, 2)
    f.seek(n // 4)
    f.write(b"\xa5" * (n // 2))
PY
expect2 "damaged rank file" "rank_00001.h5" --train.resume=damaged
cp -r ckA/step_00000006 truncated
truncate -s $((size / 2)) truncated/rank_00000.h5
expect2 "truncated rank file" "rank_00000.h5" --train.resume=truncated
echo PASS
