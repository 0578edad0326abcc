#!/usr/bin/env bash
# run_and_check.sh LMSCALE CHECK_TABLE DECK GOLDEN OUTDIR NP [extra lmscale args...]
# Runs the deck (through mpirun when NP > 1) and checks /train/steps losses against GOLDEN.
set -euo pipefail
lmscale=$1 check=$2 deck=$3 golden=$4 outdir=$5 np=$6
shift 6
mkdir -p "$outdir"
out="$outdir/$(basename "$deck" .ini)-np$np.h5"
rm -f "$out" "$out.tmp"
if [ "$np" -gt 1 ]; then
  mpirun --oversubscribe --allow-run-as-root -np "$np" "$lmscale" "$deck" --run.output="$out" "$@"
else
  "$lmscale" "$deck" --run.output="$out" "$@"
fi
"$check" "$out" /train/steps loss "$golden" "${RTOL:-2e-5}"
