#!/usr/bin/env bash
# CTest `slurm.requeue`: a training job preempted mid-run finishes with the same losses.
#
#   run_requeue_test.sh LMSCALE_BIN DECK SCRATCH_DIR
#
# On a private one-node cluster (slurm/cluster/start.sh): slurm/train_requeue.sbatch runs the tiny
# deck on 2 ranks; once it has written its checkpoint of step 25, `scontrol requeue` stops it (Slurm sends SIGTERM:
# the ranks checkpoint and exit 75) and puts it back in the queue; its second start resumes from
# the checkpoint (train.resume = auto) and finishes. The two results files' losses together must
# equal those of the same run uninterrupted (mpirun, same 2-rank layout) bitwise. Exit 77
# (skipped) where a cluster cannot be run, as run_slurm_test.sh.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t0=$SECONDS
say()  { echo "[slurm-requeue +$((SECONDS - t0))s] $*"; }
fail() { echo "[slurm-requeue] FAIL: $*" >&2; for f in "${S:-/nonexistent}"/*.out; do [[ -f $f ]] && { echo "--- $f"; grep -v '^step' "$f" | tail -n 40; }; done; exit 1; }
[[ $# -eq 3 ]] || fail "usage: run_requeue_test.sh LMSCALE_BIN DECK SCRATCH_DIR"
bin=$1 deck=$2 scratch=$3

missing=()
for c in munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo; do command -v "$c" >/dev/null || missing+=("$c"); done
compgen -G "/usr/lib/*/pmix2/lib/libpmix.so" >/dev/null || compgen -G "/usr/lib*/pmix*/lib/libpmix.so" >/dev/null \
  || missing+=("libpmix.so (libpmix-dev)")
[[ $(id -u) -eq 0 ]] || missing+=("root")
python3 -c 'import h5py' 2>/dev/null || missing+=("python3 h5py")
if [[ ${#missing[@]} -gt 0 ]]; then
  msg="cannot run a local Slurm cluster, missing: ${missing[*]}"
  [[ -n ${LMSCALE_REQUIRE_SLURM:-} ]] && fail "$msg (LMSCALE_REQUIRE_SLURM is set)"
  echo "[slurm-requeue] SKIP: $msg"; exit 77
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
export LMSCALE_BIN=$bin LMSCALE_ROOT=$repo
rm -rf "$scratch"; mkdir -p "$scratch" || fail "cannot create '$scratch'"
S=$(cd "$scratch" && pwd)
# A model a little larger than the deck's, so that the run goes on for seconds after step 25 (the
# requeue must reach it mid-run): ~1.5 ms a step on 2 idle cores, so seconds after step 25 (it stopped at steps 131-327 of 1500 in trials).
steps=1500
args=(--parallel.device=cpu --train.steps=$steps --optim.cosine_steps=$steps --train.log_every=1 --run.progress=true
      --model.d_model=64 --model.d_ff=160 --model.num_layers=2 --model.context_length=32)

D=""
cleanup() {
  local rc=$?
  [[ -n $D ]] && { scancel --quiet --full "${jobid:-0}" 2>/dev/null; "$repo/slurm/cluster/stop.sh" "$D"; say "cluster stopped"; }
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The reference: the same layout without Slurm, and the same BLAS threads as the job
# (slurm/train_requeue.sbatch exports OMP_NUM_THREADS = SLURM_CPUS_PER_TASK or 1, which OpenBLAS
# follows): OpenBLAS's multithreaded GEMMs round differently (1e-7 from step 7 with 2 threads
# against 1 on the 2-core dev machine), and the comparison is bitwise.
OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --allow-run-as-root --bind-to none \
  -np 2 "$bin" "$deck" "${args[@]}" --run.output="$S/reference.h5" > "$S/reference.log" 2>&1 \
  || fail "reference run: exit $?"
say "reference run done"

D=$("$repo/slurm/cluster/start.sh") || { D=""; fail "could not start the cluster"; }
# shellcheck disable=SC1091
source "$D/env"
extra=(); (( $(nproc) < 2 )) && extra+=(--overcommit)
jobid=$(sbatch --parsable --ntasks=2 "${extra[@]}" --output="$S/job-%j.out" "$repo/slurm/train_requeue.sbatch" \
        "$deck" "$S/out" "${args[@]}" --train.checkpoint_every=25) || fail "sbatch failed"
jobid=${jobid%%;*}
out=$S/job-$jobid.out
say "submitted job $jobid"
# Progress is read from the checkpoint directory (written every 25 steps), not from the job's
# output, which reaches the file late.
# (keep_checkpoints = 2 removes older ones: any complete one will do.)
ckpts="$S/out/checkpoints-$jobid/step_*/index.h5"
for i in $(seq 1 800); do
  compgen -G "$ckpts" >/dev/null && break
  (( i % 20 == 0 )) && [[ -z $(squeue -h -j "$jobid" -o %i 2>/dev/null) ]] && fail "job $jobid ended before step 25"
  sleep 0.05
done
compgen -G "$ckpts" >/dev/null || fail "job $jobid wrote no checkpoint in 40 s"
scontrol requeue "$jobid" || fail "scontrol requeue $jobid failed"
say "requeued job $jobid mid-run"
for _ in $(seq 1 600); do
  [[ -z $(squeue -h -j "$jobid" -o %i 2>/dev/null) ]] && break
  # Slurm holds a requeued job back (BeginTime, ~2 min); the test need not wait for that.
  [[ $(squeue -h -j "$jobid" -o %r 2>/dev/null) == BeginTime ]] && scontrol update JobId="$jobid" StartTime=now 2>/dev/null
  sleep 0.25
done
[[ -z $(squeue -h -j "$jobid" -o %i 2>/dev/null) ]] && rec=$(scontrol --oneliner show job "$jobid") || fail "job $jobid still queued after 150 s"
[[ $rec == *JobState=COMPLETED* ]] || fail "job $jobid did not complete: $rec"
[[ $rec == *Restarts=1* ]] || fail "job $jobid was not restarted once: $rec"
r0=$(compgen -G "$S/out/*-$jobid-r0.h5") || fail "no results of the first start"
r1=$(compgen -G "$S/out/*-$jobid-r1.h5") || fail "no results of the second start"
python3 - "$r0" <<'PY' || fail "the first start's results are not marked interrupted"
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    assert int(f["/train"].attrs["interrupted"]) == 1
    print("first start stopped at step", int(f["/train"].attrs["stopped_at_step"]))
PY
python3 "$here/../regression/compare_losses.py" "$S/reference.h5" 0 "$r0" "$r1" || fail "losses differ from the uninterrupted run"
say "PASS: requeued mid-run, resumed, same losses as the uninterrupted run"
