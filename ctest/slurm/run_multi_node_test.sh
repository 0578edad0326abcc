#!/usr/bin/env bash
# CTest `slurm.multi_node`: slurm/multi_node.sbatch across a private two-node Slurm cluster on this
# one machine (slurm/cluster/start.sh with SLURM_NODES=2: two network namespaces joined by a veth
# pair, one slurmd in each, distinct host names).
#
#   run_multi_node_test.sh LMSCALE_BIN SCRATCH_DIR
#
# Through slurm/cluster/submit_wait.sh (run inside the cluster's namespace):
#   1. multi_node.sbatch, 2 nodes x 2 tasks, mpi backend on the CPU, decks/multi_node_train.ini
#      -> exit 0; /system/ranks has ranks 0-3 on two hosts, 0,1 on one and 2,3 on the other, local
#      ranks 0,1 on each; the losses equal a one-process run of the same deck (rtol 1e-5: the
#      reduction order differs); /system/comm_paths shows the gradient all-reduce took `hier`
#      (shared memory inside each node, TCP between the nodes) and nothing took node-only `shm`.
#   2. bench-collectives across the two nodes with every result checked (all-reduce 64 KiB-1 MiB,
#      algo auto and library) -> exit 0 (no wrong element), paths hier and library-net recorded.
#   3. the same training launched with mpirun inside a two-node allocation (orted on the second
#      node through srun, out-of-band TCP over the veth pair) -> the same checks as 1.
#   4. an accounting run with parallel.tp=4 (the tp group spans both nodes) -> the job log warns
#      "parallel.tp=4 ... span nodes"; with parallel.tp=2 (inside a node) -> no warning.
# Stops the cluster on exit, whatever happened. Exit 77 (skipped, with the reason) without root,
# the Slurm packages, or the right to make network namespaces, unless LMSCALE_REQUIRE_SLURM is set.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t0=$SECONDS
say()  { echo "[slurm-multi-node +$((SECONDS - t0))s] $*"; }
fail() { echo "[slurm-multi-node] FAIL: $*" >&2; exit 1; }
skip() {
  [[ -n ${LMSCALE_REQUIRE_SLURM:-} ]] && fail "$1 (LMSCALE_REQUIRE_SLURM is set)"
  echo "[slurm-multi-node] SKIP: $1"
  exit 77
}

[[ $# -eq 2 ]] || fail "usage: run_multi_node_test.sh LMSCALE_BIN SCRATCH_DIR"
bin=$1 scratch=$2

# ---- skip when the machine cannot run a two-node cluster ----
missing=()
for c in munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo ip unshare nsenter; do
  command -v "$c" >/dev/null || missing+=("$c")
done
compgen -G "/usr/lib/*/pmix2/lib/libpmix.so" >/dev/null || compgen -G "/usr/lib*/pmix*/lib/libpmix.so" >/dev/null \
  || missing+=("libpmix.so (libpmix-dev)")
[[ $(id -u) -eq 0 ]] || missing+=("root")
[[ ${#missing[@]} -eq 0 ]] || skip "cannot run a local Slurm cluster, missing: ${missing[*]} (scripts/deps/slurm.sh installs the packages)"
# Containers often forbid new namespaces (no CAP_SYS_ADMIN, seccomp): probe what start.sh does
# (a network namespace, entered with fresh UTS and mount namespaces, a host name set inside).
probe=lmscale-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then
  skip "cannot create network namespaces here (ip netns add failed: needs CAP_SYS_ADMIN); the two-node cluster needs them"
fi
if ! nsenter --net="/run/netns/$probe" unshare --uts --mount --propagation private sh -c 'hostname lmscale-probe' \
     >/dev/null 2>&1; then
  ip netns del "$probe"
  skip "cannot create UTS/mount namespaces inside a network namespace here (unshare --uts --mount failed)"
fi
ip netns del "$probe"
python3 -c 'import h5py, numpy' 2>/dev/null || fail "python3 with h5py and numpy is needed to check the outputs (make deps)"

[[ -x $bin ]] || fail "no executable lmscale at '$bin'"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
export LMSCALE_BIN=$bin LMSCALE_ROOT=$repo
rm -rf "$scratch"; mkdir -p "$scratch" || fail "cannot create scratch dir '$scratch'"
S=$(cd "$scratch" && pwd)
decks=$here/decks
submit=$repo/slurm/cluster/submit_wait.sh
export SUBMIT_WAIT_TIMEOUT=${SUBMIT_WAIT_TIMEOUT:-60}
# Open MPI's TCP transport between the nodes: only the veth pair's subnet (the namespaces have
# nothing else but lo, which Open MPI excludes anyway; a real cluster names its fabric here).
export OMPI_MCA_btl_tcp_if_include=${SLURM_NODES_NET:-10.219.0}.0/24
# Open MPI binds nothing under srun; the shm threads share the two cores with 4 ranks.
export LMSCALE_SHM_THREADS=1

D=""
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 && -n $D && -d $D/log ]]; then
    for f in "$D"/log/slurmctld.log "$D"/log/slurmd-*.log; do
      [[ -s $f ]] && { echo "===== $f (last 30 lines)"; tail -n 30 "$f"; }
    done
  fi
  if [[ -n $D ]]; then "$repo/slurm/cluster/stop.sh" "$D"; say "cluster stopped"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two fake GPUs per node: multi_node.sbatch asks for --gpus-per-node; the runs use the CPU.
D=$(SLURM_NODES=2 SLURM_GPUS=2 "$repo/slurm/cluster/start.sh") || { D=""; fail "could not start the two-node cluster"; }
# shellcheck disable=SC1091
source "$D/env"
say "cluster up in $D; lmscale = $bin"

show_out() { for f in "$@"; do [[ -f $f ]] && { echo "----- $f"; cat "$f"; }; done; }
shopt -s nullglob
# sbatch options for every job: both nodes, 2 tasks each, 1 CPU per task.
job_opts=(--nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1)
run_job() {  # NAME DECK [overrides...] -> exit code of the job; log in $S/NAME-<id>.out
  local name=$1 deck=$2; shift 2
  local rc=0
  "$D/run" "$submit" "$repo/slurm/multi_node.sbatch" "${job_opts[@]}" --output="$S/$name-%j.out" \
    -- "$deck" "$S/out/$name" --parallel.device=cpu --parallel.backend=mpi "$@" >/dev/null || rc=$?
  return $rc
}

check_train() {  # RESULTS.h5 REFERENCE.h5: hosts, losses, paths (see the header)
  python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
out, ref = sys.argv[1], sys.argv[2]
def s(x): return x.decode() if isinstance(x, bytes) else str(x)
with h5py.File(out, "r") as f, h5py.File(ref, "r") as g:
    ranks = f["/system/ranks"][:]
    hosts = {int(r["rank"]): s(r["host"]) for r in ranks}
    local = {int(r["rank"]): int(r["local_rank"]) for r in ranks}
    assert sorted(hosts) == [0, 1, 2, 3], f"ranks {sorted(hosts)}"
    assert len(set(hosts.values())) == 2, f"expected two hosts, got {hosts}"
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], f"ranks not node by node: {hosts}"
    assert [local[r] for r in range(4)] == [0, 1, 0, 1], f"local ranks {local}"
    print(f"ok: /system/ranks: 0,1 on {hosts[0]}, 2,3 on {hosts[2]}")
    a, b = f["/train/steps"]["loss"][:], g["/train/steps"]["loss"][:]
    assert len(a) == len(b) > 0, f"{len(a)} steps vs {len(b)} in the reference"
    assert np.allclose(a, b, rtol=1e-5, atol=0), f"losses differ: 2x2 {a.tolist()} vs 1 process {b.tolist()}"
    print(f"ok: losses 2 nodes x 2 = 1 process (max rel diff {np.max(np.abs(a - b) / np.abs(b)):.2e}): {a.tolist()}")
    paths = f["/system/comm_paths"][:]
    world = {s(p["path"]): int(p["calls"]) for p in paths if s(p["communicator"]) == "world"}
    assert world.get("hier", 0) > 0, f"gradient all-reduce did not take hier (shm in node + network): {world}"
    assert "shm" not in world, f"node-only shm on a communicator spanning nodes: {world}"
    assert all(p == "hier" or p.endswith("-net") for p in world), f"unexpected paths {world}"
    print(f"ok: /system/comm_paths world: {world}")
PY
}

# ---- 1. training across two nodes vs one process ----
"$bin" "$decks/multi_node_train.ini" --run.output="$S/ref.h5" --run.progress=false >"$S/ref.out" 2>&1 \
  || { show_out "$S/ref.out"; fail "the one-process reference run failed"; }
rc=0; run_job train "$decks/multi_node_train.ini" || rc=$?
if [[ $rc -ne 0 ]]; then show_out "$S"/train-*.out; fail "multi_node.sbatch (train) exited $rc, expected 0"; fi
h5=("$S"/out/train/multi_node_train-*.h5)
[[ ${#h5[@]} -eq 1 ]] || { show_out "$S"/train-*.out; fail "expected one HDF5 file from the train job, found ${#h5[@]}"; }
check_train "${h5[0]}" "$S/ref.h5" || { show_out "$S"/train-*.out; fail "train job output check failed"; }
say "ok: multi_node.sbatch train, 2 nodes x 2 tasks"

# ---- 2. bench-collectives across the two nodes, every result checked ----
for algo in auto library; do
  rc=0; run_job "bench-$algo" "$repo/inputs/collectives_mpi.ini" --bench.algo=$algo --bench.min_bytes=65536 \
    --bench.max_bytes=1048576 --bench.step_factor=4 --bench.warmup=1 --bench.steps=3 --bench.check=true || rc=$?
  if [[ $rc -ne 0 ]]; then show_out "$S"/bench-$algo-*.out; fail "bench-collectives algo=$algo across nodes exited $rc"; fi
  b=("$S"/out/bench-$algo/*.h5)
  [[ ${#b[@]} -eq 1 ]] || fail "bench-collectives algo=$algo wrote ${#b[@]} files"
  want=hier; [[ $algo == library ]] && want=library-net
  python3 - "${b[0]}" "$want" <<'PY' || { show_out "$S"/bench-$algo-*.out; fail "bench-collectives algo=$algo output check failed"; }
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    rows = f["/bench_collectives/results"][:]
    g = f["/bench_collectives"]
    assert int(g.attrs["nodes"]) == 2 and int(g.attrs["ranks"]) == 4, dict(g.attrs)
    paths = {r["path"].decode() for r in rows}
    assert paths == {sys.argv[2]}, f"paths {paths}, expected {sys.argv[2]}"
    assert all(int(r["errors"]) == 0 for r in rows), "wrong elements"
    print(f"ok: {len(rows)} sizes, path {sys.argv[2]}, all checked")
PY
  say "ok: bench-collectives algo=$algo across nodes"
done

# ---- 3. the same training launched by mpirun inside the allocation ----
# mpirun starts an orted on node 1 through srun; it connects back over Open MPI's out-of-band TCP,
# which must use the veth pair as well.
cat > "$S/mpirun.sbatch" <<EOF
#!/bin/bash
export OMPI_MCA_oob_tcp_if_include=$OMPI_MCA_btl_tcp_if_include
mpirun --allow-run-as-root --bind-to none "$bin" "$decks/multi_node_train.ini" --parallel.device=cpu \\
  --parallel.backend=mpi --run.output="$S/out/mpirun.h5"
EOF
rc=0; "$D/run" "$submit" "$S/mpirun.sbatch" "${job_opts[@]}" --output="$S/mpirun-%j.out" >/dev/null || rc=$?
if [[ $rc -ne 0 ]]; then show_out "$S"/mpirun-*.out; fail "mpirun across the two nodes exited $rc"; fi
check_train "$S/out/mpirun.h5" "$S/ref.h5" || { show_out "$S"/mpirun-*.out; fail "mpirun job output check failed"; }
say "ok: mpirun (orted via srun) across 2 nodes x 2"

# ---- 4. tp placement: a tp group across nodes is warned about, one inside a node is not ----
for tp in 4 2; do
  rc=0; run_job "tp$tp" "$decks/multi_node_train.ini" --run.job=accounting --parallel.tp=$tp || rc=$?
  if [[ $rc -ne 0 ]]; then show_out "$S"/tp$tp-*.out; fail "accounting with tp=$tp exited $rc"; fi
  log=("$S"/tp$tp-*.out)
  if [[ $tp -eq 4 ]]; then
    grep -q "warning: parallel.tp=4: 1 of 1 tensor-parallel group(s) span nodes" "${log[0]}" \
      || { show_out "${log[@]}"; fail "no warning for a tp=4 group spanning two nodes"; }
  else
    grep -q "tensor-parallel group(s) span nodes" "${log[0]}" && { show_out "${log[@]}"; fail "tp=2 fits a node but was warned about"; }
  fi
  say "ok: tp=$tp placement $([[ $tp -eq 4 ]] && echo warned || echo silent)"
done

say "PASS"
