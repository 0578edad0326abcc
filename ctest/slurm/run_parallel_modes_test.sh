#!/usr/bin/env bash
# CTest `slurm.parallel_modes`: tensor, pipeline and dp x tp training through slurm/cpu.sbatch.
#
#   run_parallel_modes_test.sh LMSCALE_BIN CHECK_TABLE DECK GOLDEN SCRATCH_DIR
#
# DECK is ctest/regression/tiny_train_tp.ini, GOLDEN its losses on one process. On a private
# one-node cluster (slurm/cluster/start.sh, 4 CPUs declared so 4 ranks fit on a 2-core machine),
# each run is a real sbatch of slurm/cpu.sbatch on the mpi backend, and must exit 0 and log
# GOLDEN's losses (one row per step, RTOL 2e-5 as regression.tensor_parallel):
#   1. tp = 2 on 2 tasks
#   2. pp = 2 (1f1b, 2 microbatches) on 2 tasks
#   3. dp = 2 x tp = 2 (dp explicit) on 4 tasks, through the site hooks: LMSCALE_ENV (a file the
#      job sources) and LMSCALE_LAUNCH_PREFIX (a wrapper that must run for the check and for each
#      of the 4 tasks), and LMSCALE_SRUN_MPI=pmix
#   4. pp = 2 on 3 tasks -> exit 2 before srun, the error naming the world size 3
# Before issue 37 the job scripts checked the deck as one process (world size 1), so 1-3 exited 2.
# Exit 77 (skipped) where a cluster cannot be run, as run_slurm_test.sh.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t0=$SECONDS
S=""
say()  { echo "[slurm-modes +$((SECONDS - t0))s] $*"; }
fail() {
  echo "[slurm-modes] FAIL: $*" >&2
  [[ -n $S ]] && for f in "$S"/*.out; do [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }; done
  exit 1
}
[[ $# -eq 5 ]] || fail "usage: run_parallel_modes_test.sh LMSCALE_BIN CHECK_TABLE DECK GOLDEN SCRATCH_DIR"
bin=$1 check=$2 deck=$3 golden=$4 scratch=$5

missing=()
for c in munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo; do command -v "$c" >/dev/null || missing+=("$c"); done
compgen -G "/usr/lib/*/pmix2/lib/libpmix.so" >/dev/null || compgen -G "/usr/lib*/pmix*/lib/libpmix.so" >/dev/null \
  || missing+=("libpmix.so (libpmix-dev)")
[[ $(id -u) -eq 0 ]] || missing+=("root")
if [[ ${#missing[@]} -gt 0 ]]; then
  msg="cannot run a local Slurm cluster, missing: ${missing[*]} (scripts/deps/slurm.sh installs the packages)"
  [[ -n ${LMSCALE_REQUIRE_SLURM:-} ]] && fail "$msg (LMSCALE_REQUIRE_SLURM is set)"
  echo "[slurm-modes] SKIP: $msg"; exit 77
fi
[[ -x $bin ]] || fail "no executable lmscale at '$bin'"
[[ -x $check ]] || fail "no check_table at '$check'"
[[ -r $deck && -r $golden ]] || fail "cannot read '$deck' or '$golden'"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
# Each rank one BLAS thread, as the golden losses (cpu.sbatch sets OMP_NUM_THREADS=1 too).
export LMSCALE_BIN=$bin LMSCALE_ROOT=$repo OPENBLAS_NUM_THREADS=1
unset LMSCALE_ENV LMSCALE_LAUNCH_PREFIX LMSCALE_SRUN_MPI LMSCALE_SRUN_ARGS
rm -rf "$scratch"; mkdir -p "$scratch" || fail "cannot create '$scratch'"
S=$(cd "$scratch" && pwd)
submit=$repo/slurm/cluster/submit_wait.sh
export SUBMIT_WAIT_TIMEOUT=${SUBMIT_WAIT_TIMEOUT:-60}
steps=$(grep -cv '^#' "$golden")

D=""
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 && -n $D && -d $D/log ]]; then
    for f in "$D"/log/slurmctld.log "$D"/log/slurmd.log; do [[ -s $f ]] && { echo "===== $f (last 30 lines)"; tail -n 30 "$f"; }; done
  fi
  [[ -n $D ]] && { "$repo/slurm/cluster/stop.sh" "$D"; say "cluster stopped"; }
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cpus=$(nproc); (( cpus < 4 )) && cpus=4
D=$(SLURM_CPUS=$cpus "$repo/slurm/cluster/start.sh") || { D=""; fail "could not start the cluster"; }
# shellcheck disable=SC1091
source "$D/env"
say "cluster up in $D ($cpus CPUs declared)"

# job NAME NTASKS EXPECTED_RC OVERRIDES...: cpu.sbatch on the mpi backend; the results go to
# $S/out/NAME/<deck stem>-<jobid>.h5.
job() {
  local name=$1 n=$2 want=$3; shift 3
  local rc=0
  "$submit" "$repo/slurm/cpu.sbatch" --ntasks="$n" --output="$S/$name-%j.out" \
    -- "$deck" "$S/out/$name" --parallel.backend=mpi --run.progress=false "$@" >/dev/null || rc=$?
  [[ $rc -eq $want ]] || fail "$name: cpu.sbatch on $n tasks exited $rc, expected $want"
}
# check_run NAME NTASKS: one results file with GOLDEN's losses, one row per step.
check_run() {
  shopt -s nullglob
  local h5=("$S/out/$1"/*.h5)
  shopt -u nullglob
  [[ ${#h5[@]} -eq 1 ]] || fail "$1: expected one HDF5 file in $S/out/$1, found ${#h5[@]}"
  grep -q "^# lmscale resolved configuration ($2 ranks)" "$S/$1"-*.out || fail "$1: the deck was not checked for $2 ranks"
  "$check" "${h5[0]}" /train/steps loss "$golden" 2e-5 || fail "$1: /train/steps losses differ from $golden (or not $steps steps)"
  say "ok: $1 on $2 tasks, $steps steps, losses = one process's"
}

job tp2 2 0 --parallel.tp=2
check_run tp2 2

job pp2 2 0 --parallel.pp=2 --parallel.microbatches=2 --parallel.schedule=1f1b
check_run pp2 2

# The site hooks: LMSCALE_ENV sets the wrapper's log; the wrapper (LMSCALE_LAUNCH_PREFIX) logs
# each start and runs lmscale. Expected: the check (1) and the 4 tasks.
cat > "$S/site_env.sh" <<EOF
export LMSCALE_TEST_PREFIX_LOG=$S/prefix.log
EOF
cat > "$S/wrap.sh" <<'EOF'
#!/bin/bash
echo "procid=${SLURM_PROCID:-?} step=${SLURM_STEP_ID:-?}" >> "${LMSCALE_TEST_PREFIX_LOG:?LMSCALE_ENV was not sourced}"
exec "$@"
EOF
chmod +x "$S/wrap.sh"
LMSCALE_ENV=$S/site_env.sh LMSCALE_LAUNCH_PREFIX="$S/wrap.sh" LMSCALE_SRUN_MPI=pmix \
  job dp2_tp2 4 0 --parallel.dp=2 --parallel.tp=2
check_run dp2_tp2 4
starts=$(wc -l < "$S/prefix.log" 2>/dev/null || echo 0)
[[ $starts -eq 5 ]] || fail "dp2_tp2: the launch prefix ran $starts times, expected 5 (the check and 4 tasks)"
grep -q '^== run: srun --mpi=pmix ' "$S"/dp2_tp2-*.out || fail "dp2_tp2: srun did not get --mpi=pmix"
grep -q '^== run: srun .*--mpi' "$S"/tp2-*.out && fail "tp2: srun got --mpi although LMSCALE_SRUN_MPI is unset"
say "ok: LMSCALE_ENV, LMSCALE_LAUNCH_PREFIX and LMSCALE_SRUN_MPI used"

# A deck that cannot fit the job's task count is refused before any rank starts.
job pp2_on3 3 2 --parallel.pp=2
grep -q "not launching" "$S"/pp2_on3-*.out || fail "pp2_on3: no 'not launching' line"
grep -q "error: .*world size 3" "$S"/pp2_on3-*.out || fail "pp2_on3: the error does not name the world size 3"
[[ -z $(compgen -G "$S/out/pp2_on3/*.h5") ]] || fail "pp2_on3: a refused deck wrote results"
say "ok: pp = 2 on 3 tasks -> exit 2 before srun"

say "PASS"
