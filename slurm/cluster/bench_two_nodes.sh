#!/usr/bin/env bash
# bench-collectives on one node beside two nodes, through the two-node test cluster
# (start.sh with SLURM_NODES=2), for docs/clusters.md:
#
#   slurm/cluster/bench_two_nodes.sh OUTDIR [--bench.key=value ...]
#
# Runs inputs/collectives_mpi.ini (all-reduce, fp32, checked) with multi_node.sbatch, CPU, mpi
# backend, as
#   2 ranks: 1 node x 2 (algo auto = shm; library)  vs  2 nodes x 1 (library over TCP)
#   4 ranks: 1 node x 4 (auto = shm; library)       vs  2 nodes x 2 (auto = hier; library)
# writes OUTDIR/<case>.h5 and the analysis tables (python3 -m analysis.report) in OUTDIR/report,
# and stops the cluster. Extra arguments are deck overrides for every run (default sweep:
# 64 KiB .. 64 MiB by x4). Both "nodes" share this machine's cores and its kernel's TCP stack:
# compare the shapes of the curves, not the absolute numbers (docs/clusters.md).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[[ $# -ge 1 ]] || { echo "usage: bench_two_nodes.sh OUTDIR [--bench.key=value ...]" >&2; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
export LMSCALE_BIN=${LMSCALE_BIN:-$repo/build/lmscale} LMSCALE_ROOT=$repo
export OMPI_MCA_btl_tcp_if_include=${SLURM_NODES_NET:-10.219.0}.0/24
# More ranks than cores on a small machine: let idle MPI ranks yield instead of spinning, the same
# for every case (Open MPI cannot tell it is oversubscribed under srun).
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}

# 4 ranks on one node: declare 4 CPUs per node (the machine may have fewer; every case shares them).
D=$(SLURM_NODES=2 SLURM_GPUS=4 SLURM_CPUS=${SLURM_CPUS:-4} "$here/start.sh")
trap '"$here/stop.sh" "$D"' EXIT

sweep=(--bench.min_bytes=64K --bench.max_bytes=64M --bench.step_factor=4 --bench.warmup=2 --bench.steps=5 "$@")
run() {  # NAME NODES TASKS_PER_NODE ALGO
  local name=$1 nodes=$2 tpn=$3 algo=$4
  "$D/run" "$here/submit_wait.sh" "$repo/slurm/multi_node.sbatch" --nodes="$nodes" --ntasks-per-node="$tpn" \
    --gpus-per-node="$tpn" --cpus-per-task=1 --output="$out/$name.out" \
    -- "$repo/inputs/collectives_mpi.ini" "$out/tmp-$name" --parallel.device=cpu --parallel.backend=mpi \
    --bench.algo="$algo" "${sweep[@]}" >/dev/null
  mv "$out/tmp-$name"/*.h5 "$out/$name.h5" && rmdir "$out/tmp-$name"
  grep -E '^(# bench|all-reduce)' "$out/$name.out" | sed "s/^/$name: /"
}
run 1node-2r-auto 1 2 auto
run 1node-2r-library 1 2 library
run 2node-2r-library 2 1 library
run 1node-4r-auto 1 4 auto
run 1node-4r-library 1 4 library
run 2node-4r-auto 2 2 auto
run 2node-4r-library 2 2 library

python3 -m analysis.report "$out"/*.h5 --out "$out/report" --format md,png >/dev/null
echo "tables: $out/report/index.md"
