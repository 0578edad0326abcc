#!/usr/bin/env bash
# CTest `slurm.elastic`: a training job that loses one of its two nodes mid-run finishes on the
# other with the losses of an uninterrupted run of the same global batch.
#
#   run_elastic_test.sh LMSCALE_BIN DECK SCRATCH_DIR
#
# On a private two-node cluster (slurm/cluster/start.sh, SLURM_NODES=2, SLURMD_TIMEOUT=10 so that
# slurmctld gives a silent node up after 10 s instead of 30):
#   1. slurm/train_elastic.sbatch, 2 nodes x 1 task (dp 2, train.grad_accum 1, global batch 8,
#      micro-batch 4). Once a checkpoint exists, node 1 is lost: every process in its namespaces
#      (its slurmd, the step's slurmstepd, rank 1) gets SIGKILL and its end of the veth pair goes
#      down, so nothing of it answers or resets a connection, as when a machine loses power.
#      slurmctld marks it down after SlurmdTimeout, takes it out of the job (--no-kill) and ends
#      the step; the script relaunches on node 0 with dp 1 and train.grad_accum 2 from the newest
#      checkpoint. Checked: exit 0, one restart, what the job log says, the second launch's
#      /train attributes (resumed_at_step > 0, grad_accum 2, one rank on node 0), and the losses
#      of both launches (the first's NAME.tmp up to the resumed step, the second's after it)
#      against a one-process run with train.grad_accum = 2 (the same global batch and
#      micro-batch): every step within 1e-6 (absolute). Done twice, on a fresh cluster each: with
#      rank 0 left to meet the loss as it comes (it waits in its collective until Slurm ends the
#      step, or ends on the broken connection), and with rank 0 ended by SIGPIPE at once, before
#      Slurm has noticed, after which Slurm 22.05 keeps counting the step's CPUs on node 0 as
#      busy (the relaunch must pass srun --overlap, or it waits for ever).
#   2. the same job where a rank fails without any node lost (a test-only sleep of rank 1 and
#      parallel.timeout_s = 2: the watchdog ends the run with exit 1): no restart, exit 1.
# Exit 77 (skipped) where a two-node cluster cannot run (as slurm.multi_node), unless
# LMSCALE_REQUIRE_SLURM is set.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t0=$SECONDS
say()  { echo "[slurm-elastic +$((SECONDS - t0))s] $*"; }
fail() {
  echo "[slurm-elastic] FAIL: $*" >&2
  for f in "${S:-/nonexistent}"/*.out; do [[ -f $f ]] && { echo "--- $f"; grep -v -e '^step' -e '^[a-z_]* = ' "$f" | tail -n 40; }; done
  exit 1
}
skip() {
  [[ -n ${LMSCALE_REQUIRE_SLURM:-} ]] && fail "$1 (LMSCALE_REQUIRE_SLURM is set)"
  echo "[slurm-elastic] SKIP: $1"; exit 77
}
[[ $# -eq 3 ]] || fail "usage: run_elastic_test.sh LMSCALE_BIN DECK SCRATCH_DIR"
bin=$1 deck=$2 scratch=$3

missing=()
for c in munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo ip unshare nsenter mpirun; do
  command -v "$c" >/dev/null || missing+=("$c")
done
compgen -G "/usr/lib/*/pmix2/lib/libpmix.so" >/dev/null || compgen -G "/usr/lib*/pmix*/lib/libpmix.so" >/dev/null \
  || missing+=("libpmix.so (libpmix-dev)")
[[ $(id -u) -eq 0 ]] || missing+=("root")
python3 -c 'import h5py, numpy' 2>/dev/null || missing+=("python3 h5py numpy")
[[ ${#missing[@]} -eq 0 ]] || skip "cannot run a local Slurm cluster, missing: ${missing[*]} (scripts/deps/slurm.sh installs the packages)"
probe=lmscale-probe-$$
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces here (ip netns add failed: needs CAP_SYS_ADMIN)"
if ! nsenter --net="/run/netns/$probe" unshare --uts --mount --propagation private sh -c 'hostname lmscale-probe' \
     >/dev/null 2>&1; then
  ip netns del "$probe"
  skip "cannot create UTS/mount namespaces inside a network namespace here (unshare --uts --mount failed)"
fi
ip netns del "$probe"

bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
export LMSCALE_BIN=$bin LMSCALE_ROOT=$repo
rm -rf "$scratch"; mkdir -p "$scratch" || fail "cannot create '$scratch'"
S=$(cd "$scratch" && pwd)
# ~3 ms a step for 2 ranks on 2 idle cores: the run goes on for many seconds after its first
# checkpoint (step 50), so node 1 is lost mid-run; log_every = 1 flushes every row of the first
# launch's results before the loss.
steps=6000
args=(--parallel.device=cpu --train.steps=$steps --optim.cosine_steps=$steps
      --train.log_every=1 --run.progress=true --model.d_model=64 --model.d_ff=160 --model.num_layers=2
      --model.context_length=32 --train.batch_size=8)

D="" jobid=""
cleanup() {
  local rc=$?
  if [[ -n $D ]]; then
    if [[ $rc -ne 0 && -d $D/log ]]; then
      for f in "$D"/log/slurmctld.log "$D"/log/slurmd-*.log; do [[ -s $f ]] && { echo "===== $f (last 20 lines)"; tail -n 20 "$f"; }; done
    fi
    "$repo/slurm/cluster/stop.sh" "$D"; say "cluster stopped"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The reference: one process, grad_accum 2 (global batch 8 of micro-batches of 4, as both layouts
# of the job), one BLAS thread as the job's tasks (OMP_NUM_THREADS = cpus-per-task = 1).
OMP_NUM_THREADS=1 "$bin" "$deck" "${args[@]}" --train.grad_accum=2 \
  --run.output="$S/reference.h5" >"$S/reference.log" 2>&1 || fail "reference run: exit $?"
say "reference run done"
# The jobs: Open MPI's TCP transport over the veth pair only; the shm threads share the two cores.
export OMPI_MCA_btl_tcp_if_include=${SLURM_NODES_NET:-10.219.0}.0/24 LMSCALE_SHM_THREADS=1

start_cluster() {  # a fresh two-node cluster in $D (node 1 of the previous one is gone for good)
  if [[ -n $D ]]; then "$repo/slurm/cluster/stop.sh" "$D"; D=""; fi
  D=$(SLURMD_TIMEOUT=10 SLURM_NODES=2 "$repo/slurm/cluster/start.sh") || { D=""; fail "could not start the two-node cluster"; }
  mapfile -t names < <("$D/run" sinfo -h -N -o %N | sort)
  mapfile -t netns < "$D/netns"
  say "cluster up in $D: ${names[*]}"
}
submit() {  # NAME [extra lmscale args...] -> job id
  local name=$1; shift
  local id
  id=$("$D/run" sbatch --parsable --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --output="$S/$name-%j.out" \
       "$repo/slurm/train_elastic.sbatch" "$deck" "$S/$name" "${args[@]}" --parallel.backend=mpi "$@") || fail "sbatch failed"
  echo "${id%%;*}"
}
wait_job() {  # JOB SECONDS -> the record of the ended job in $rec
  local _
  for _ in $(seq 1 $(($2 * 4))); do
    [[ -z $("$D/run" squeue -h -j "$1" -o %i 2>/dev/null) ]] && break
    sleep 0.25
  done
  [[ -z $("$D/run" squeue -h -j "$1" -o %i 2>/dev/null) ]] || { "$D/run" scancel "$1"; fail "job $1 still running after $2 s"; }
  rec=$("$D/run" scontrol --oneliner show job "$1")
}

# lose_node NAME HOW: a job on both nodes loses node 1 once its first checkpoint exists: every
# process in node 1's namespaces (slurmd, slurmstepd, rank 1) gets SIGKILL and node 1's link goes
# down. HOW = as-it-comes: rank 0 left alone; HOW = rank0-dies: rank 0 also ends at once (SIGPIPE,
# as when it writes to the reset connection) before Slurm has noticed. Then the checks of the
# header, 1.
lose_node() {
  local name=$1 how=$2 jobid i victims p
  start_cluster
  jobid=$(submit "$name" --train.checkpoint_every=50)
  say "$name: submitted job $jobid"
  local ckpts="$S/$name/checkpoints-$jobid/step_*/index.h5"
  for i in $(seq 1 1200); do
    compgen -G "$ckpts" >/dev/null && break
    (( i % 20 == 0 )) && [[ -z $("$D/run" squeue -h -j "$jobid" -o %i 2>/dev/null) ]] && fail "job $jobid ended before its first checkpoint"
    sleep 0.05
  done
  compgen -G "$ckpts" >/dev/null || fail "job $jobid wrote no checkpoint in 60 s"
  victims=$(ip netns pids "${netns[1]}")
  [[ -n $victims ]] || fail "no process in node 1's namespace ${netns[1]}"
  # shellcheck disable=SC2086
  kill -KILL $victims
  ip -n "${netns[1]}" link set ci0 down
  say "$name: node ${names[1]} lost (killed: $(for p in $victims; do cat "/proc/$p/comm" 2>/dev/null || echo "$p"; done | tr '\n' ' ')link down)"
  if [[ $how == rank0-dies ]]; then
    for p in $(ip netns pids "${netns[0]}"); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) == lmscale ]] && kill -PIPE "$p" && say "$name: rank 0 (pid $p) ended by SIGPIPE"
    done
  fi
  wait_job "$jobid" 150
  local out=$S/$name-$jobid.out
  [[ $rec == *JobState=COMPLETED* ]] || fail "job $jobid did not complete: $rec"
  grep -q "== elastic: lost ${names[1]}; 1 node(s) remain: ${names[0]}" "$out" || fail "the log does not name the lost node"
  grep -q "== elastic: restart 1 of 3 on ${names[0]}: 1 rank(s), dp 1, train.grad_accum 2 (global batch 8 kept)" "$out" \
    || fail "the log does not show the restart on one node with dp 1, grad_accum 2"
  [[ $(grep -c '^== elastic: restart' "$out") -eq 1 ]] || fail "not exactly one restart"
  local e0=$S/$name/tiny_train-$jobid-r0-e0.h5 e1=$S/$name/tiny_train-$jobid-r0-e1.h5
  [[ -f $e0.tmp && ! -e $e0 ]] || fail "the first launch did not end mid-run (no $e0.tmp, or it finished)"
  [[ -f $e1 ]] || fail "no results of the second launch ($e1)"
  say "$name: job $jobid finished on ${names[0]} after losing ${names[1]}"
  python3 - "$S/reference.h5" "$e0.tmp" "$e1" "${names[0]}" <<'PY' || fail "the losses or the second launch's attributes are wrong"
import sys, h5py, numpy as np
ref_path, e0_path, e1_path, node0 = sys.argv[1:]
def losses(path):
    with h5py.File(path, "r") as f:
        t = f["/train/steps"][()]
    return dict(zip(t["step"].tolist(), t["loss"].tolist()))
ref = losses(ref_path)
with h5py.File(e1_path, "r") as f:
    a = f["/train"].attrs
    resumed = int(a["resumed_at_step"])
    assert resumed > 0, f"the second launch did not resume (resumed_at_step {resumed})"
    assert int(a["grad_accum"]) == 2, f"grad_accum {a['grad_accum']}"
    hosts = {r["host"].decode() if isinstance(r["host"], bytes) else str(r["host"]) for r in f["/system/ranks"][:]}
    assert len(f["/system/ranks"]) == 1 and hosts == {node0}, f"ranks {f['/system/ranks'][:]}"
e0, e1 = losses(e0_path), losses(e1_path)
assert max(e0) >= resumed, f"the first launch's rows end at step {max(e0)}, before the resumed step {resumed}"
assert sorted(e1) == list(range(resumed + 1, len(ref) + 1)), "the second launch does not run from the checkpoint to the end"
got = {s: l for s, l in e0.items() if s <= resumed}
got.update(e1)
assert sorted(got) == sorted(ref), f"{len(got)} steps against {len(ref)}"
diff = np.array([abs(got[s] - ref[s]) for s in sorted(ref)])
print(f"first launch (2 nodes, dp 2) to step {max(e0)}, resumed at step {resumed} on one node (dp 1, grad_accum 2); "
      f"{len(ref)} steps, largest |loss - reference| {diff.max():.3e} (tolerance 1e-6)")
assert diff.max() <= 1e-6, f"step {int(diff.argmax()) + 1}: {got[int(diff.argmax()) + 1]!r} vs {ref[int(diff.argmax()) + 1]!r}"
PY
  say "ok: $name: node lost mid-run, finished on one node, losses within 1e-6 of the uninterrupted run"
}

# ---- 1. node 1 lost mid-run; then the same with rank 0 gone at once ----
lose_node elastic as-it-comes
lose_node elastic-rank0-dies rank0-dies

# ---- 2. a failure that is not a lost node is not restarted ----
start_cluster
jobid=$(LMSCALE_ELASTIC_WAIT_S=5 LMSCALE_FAULT_SLEEP_RANK=1 LMSCALE_FAULT_SLEEP_STEP=3 submit notlost --parallel.timeout_s=2)
say "submitted job $jobid (rank 1 sleeps at step 3, parallel.timeout_s = 2)"
wait_job "$jobid" 90
out=$S/notlost-$jobid.out
[[ $rec == *ExitCode=1:0* ]] || fail "job $jobid: expected exit 1, got $rec"
grep -q "every node of the job is still up: the failure is not a lost node; exit 1" "$out" || fail "no 'not a lost node' line"
grep -q '^== elastic: restart' "$out" && fail "job $jobid restarted although no node was lost"
say "ok: a rank failure without a lost node ends the job with exit 1, no restart"
say "PASS"
