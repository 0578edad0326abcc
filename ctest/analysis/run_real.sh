#!/usr/bin/env bash
# ctest analysis.real: run_real.sh LMSCALE INPUTS OUTDIR
# Runs real lmscale jobs on CPU (INPUTS/tiny_train.ini as a train run, and as two bench-model runs
# that differ in bench.batch_size, one with a memory timeline), makes the report of the three
# files with analysis.report, and checks the tables against the HDF5 files read with h5py
# (check_real.py); every table's strings are str and every number has a unit (check_strings.py,
# also on an accounting run). Exit 77 (skipped) without h5py/pandas/matplotlib unless LMSCALE_REQUIRE_ANALYSIS
# is set.
set -euo pipefail
lmscale=$1 inputs=$2 outdir=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

py=${PYTHON:-python3}
if ! "$py" -c "import h5py, pandas, matplotlib" 2>/dev/null; then
  if [ -n "${LMSCALE_REQUIRE_ANALYSIS:-}" ]; then
    echo "FAIL: h5py, pandas or matplotlib missing (LMSCALE_REQUIRE_ANALYSIS is set)"; exit 1
  fi
  echo "SKIP: h5py, pandas or matplotlib missing; install analysis/requirements.txt (make deps)"; exit 77
fi

rm -rf "$outdir"
mkdir -p "$outdir"
deck=$inputs/tiny_train.ini
bench=(--run.job=bench-model --bench.mode=train-step --bench.warmup=1 --bench.steps=2)
set -x
"$lmscale" "$deck" --run.output="$outdir/train.h5"
"$lmscale" "$deck" "${bench[@]}" --bench.batch_size=2 --run.output="$outdir/bench_b2.h5"
"$lmscale" "$deck" "${bench[@]}" --bench.batch_size=4 --bench.memory_timeline=true --run.output="$outdir/bench_b4.h5"
PYTHONPATH="$repo" MPLBACKEND=Agg "$py" -m analysis.report "$outdir/train.h5" "$outdir/bench_b2.h5" \
  "$outdir/bench_b4.h5" --out "$outdir/report"
"$lmscale" "$deck" --run.job=accounting --cost.tokens=1e9 --cost.mfu=0.4 --cost.price_per_gpu_hour=2 \
  --run.output="$outdir/accounting.h5"
set +x
"$py" "$here/check_real.py" "$outdir"
"$py" "$here/check_strings.py" "$outdir/train.h5" "$outdir/bench_b2.h5" "$outdir/bench_b4.h5" "$outdir/accounting.h5"
