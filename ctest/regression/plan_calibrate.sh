#!/usr/bin/env bash
# plan_calibrate.sh LMSCALE SOURCE_DIR OUTDIR
# run.job = calibrate on 2 CPU ranks measures GEMMs, attention, bandwidth and the MPI all-reduce,
# fits the ring's alpha and beta to the bench-collectives timings and writes a calibration file;
# the alpha-beta model must reproduce the measured times (median relative error under 50% on a
# shared machine). run.job = plan reads that file and the shipped H200 one (the xl fsdp step is
# pinned at 78.31 ms, docs/planner.md), writes /plan/layouts with the deck's row and the sweep;
# bad plan keys are exit 2 naming the key, with no results file.
set -uo pipefail
lmscale=$1 src=$2 out=$3
mkdir -p "$out"; cd "$src" || exit 1
fail=0
check() { if ! eval "$2"; then echo "FAIL $1"; fail=1; else echo "ok $1"; fi; }

mpirun -np 2 --bind-to none "$lmscale" inputs/collectives_mpi.ini --run.job=calibrate --run.output="$out/cal.h5" \
  --calibrate.output="$out/cal.ini" --bench.min_bytes=4K --bench.max_bytes=4M --bench.step_factor=4 \
  --bench.check=false > "$out/cal.log" 2>&1
check "calibrate exit 0" '[[ $? -eq 0 ]] || { tail -5 "$out/cal.log"; false; }'
check "calibration file written" '[[ -s "$out/cal.ini" ]] && grep -q "^intra_busbw_gbs = " "$out/cal.ini"'
check "alpha-beta model against the measured all-reduce" 'python3 - "$out/cal.h5" <<PY
import sys, h5py, statistics
t = h5py.File(sys.argv[1], "r")["/calibrate/collectives"]
err = [abs(float(e)) for e in t["relative_error"][:]]
print("relative errors:", ", ".join(f"{e:.2f}" for e in err))
sys.exit(0 if len(err) >= 4 and statistics.median(err) < 0.5 else 1)
PY'

"$lmscale" inputs/fsdp_xl.ini --run.job=plan --plan.gpus=2 --plan.batch_size=8 --plan.calibration="$out/cal.ini" \
  --plan.search=false --plan.sweep_max_gpus=0 --run.output="$out/plan_cpu_cal.h5" > "$out/plan_cpu_cal.log" 2>&1
check "plan reads the measured calibration" '[[ $? -eq 0 ]] && grep -q "^deck " "$out/plan_cpu_cal.log"'

"$lmscale" inputs/fsdp_xl.ini --run.job=plan --plan.gpus=2 --plan.batch_size=8 --plan.sweep_max_gpus=8 \
  --run.output="$out/plan.h5" > "$out/plan.log" 2>&1
check "plan with the shipped H200 calibration" '[[ $? -eq 0 ]] && grep -Eq "^deck +78\.3[01] ms" "$out/plan.log"'
check "layouts and sweep written" 'python3 - "$out/plan.h5" <<PY
import sys, h5py
f = h5py.File(sys.argv[1], "r")
lay, sw = f["/plan/layouts"], f["/plan/sweep"]
deck = [i for i, d in enumerate(lay["deck"][:]) if d == 1]
fits = list(lay["fits"][1:])
ok = len(deck) == 1 and len(lay["rank"]) > 5 and fits == sorted(fits, reverse=True) and sorted(set(sw["gpus"][:])) == [1, 2, 4, 8]
sys.exit(0 if ok else 1)
PY'

bad() {   # NAME KEY ARGS...: exit 2, the message names KEY, no results file
  local name=$1 key=$2; shift 2
  "$lmscale" inputs/fsdp_xl.ini --run.job=plan --run.output="$out/$name.h5" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  check "$name: exit 2 naming $key" '[[ $rc -eq 2 ]] && grep -q "$key" "$out/$name.log" && [[ ! -e "$out/$name.h5" ]]'
}
bad missing_calibration plan.calibration --plan.calibration="$out/none.ini"
bad gpus_not_multiple plan.gpus --plan.gpus=3 --parallel.tp=2
bad gpus_contradicts_dp plan.gpus --plan.gpus=4 --parallel.dp=2
exit $fail
