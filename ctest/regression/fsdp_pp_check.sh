#!/usr/bin/env bash
# fsdp_pp_check.sh LMSCALE CHECK_TABLE DECK GOLDEN OUTDIR
# fsdp over dp 2 x pp 2 (4 ranks) from a deck, through the executable: tiny_train.ini with gpipe
# and 1f1b (2 microbatches), with and without reshard_after_forward, logs one process's losses
# (GOLDEN) within 2e-5 (summation order only, as pp_save_check.sh); the interleaved schedule is
# refused with exit 2 naming parallel.schedule.
set -euo pipefail
lmscale=$1 check=$2 deck=$3 golden=$4 out=$5
rm -rf "$out"; mkdir -p "$out"; cd "$out"
mpi() { mpirun --oversubscribe --allow-run-as-root --bind-to none -np 4 "$lmscale" "$deck" "$@"; }
layout=(--parallel.dp=2 --parallel.pp=2 --parallel.zero=fsdp --parallel.microbatches=2)
for sched in gpipe 1f1b; do
  for reshard in true false; do
    mpi "${layout[@]}" --parallel.schedule=$sched --parallel.reshard_after_forward=$reshard --run.output=${sched}_${reshard}.h5
    "$check" "${sched}_${reshard}.h5" /train/steps loss "$golden" 2e-5
    echo "ok: fsdp dp 2 x pp 2 $sched, reshard_after_forward = $reshard: the golden losses"
  done
done
set +e
mpi "${layout[@]}" --parallel.schedule=interleaved --parallel.virtual_stages=2 --model.num_layers=4 \
  --run.output=refused.h5 > refused.log 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "FAIL: interleaved fsdp exit $rc (expected 2)"; cat refused.log; exit 1; }
grep 'lmscale: error:' refused.log | grep -qF parallel.schedule || { echo "FAIL: no error naming parallel.schedule"; cat refused.log; exit 1; }
[ ! -e refused.h5 ] || { echo "FAIL: refused run left refused.h5"; exit 1; }
set +e
mpi "${layout[@]}" --parallel.schedule=zb-h1 --model.num_layers=4 --run.output=refused_zb.h5 > refused_zb.log 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "FAIL: zb-h1 fsdp exit $rc (expected 2)"; cat refused_zb.log; exit 1; }
grep 'lmscale: error:' refused_zb.log | grep -qF zb-h1 || { echo "FAIL: no error naming zb-h1"; cat refused_zb.log; exit 1; }
[ ! -e refused_zb.h5 ] || { echo "FAIL: refused run left refused_zb.h5"; exit 1; }
echo "fsdp x pp regression: all checks passed"
