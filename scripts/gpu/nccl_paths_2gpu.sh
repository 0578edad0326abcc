#!/usr/bin/env bash
# For docs/clusters.md: NCCL all-reduce on 2 GPUs of one host over the three transports NCCL chooses between, forced by its own variables, so the
# curve of the intra-node path sits beside the curve of the network path:
#   p2p     default: NVLink between the GPUs (P2P)
#   shm     NCCL_P2P_DISABLE=1: staged through host shared memory
#   socket  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo: NCCL's
#           network transport (NET/Socket, TCP) as between nodes without InfiniBand, here over
#           loopback (so one host shows the network path's curve)
# bench-collectives (inputs/collectives_nccl.ini, all-reduce fp32, 1 MB .. 1 GB, checked); the
# transport NCCL really used is taken from its NCCL_DEBUG=INFO lines ("via P2P/...", "via SHM",
# "via NET/Socket"). Logs and HDF5 to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-/tmp/nccl_paths_out}
mkdir -p "$OUT"
nvidia-smi topo -m > "$OUT/machine.txt" 2>&1
if ! timeout 480 scripts/gpu/build.sh lmscale > "$OUT/build.log" 2>&1; then
  echo "build failed:"; grep -E "error|FAILED" "$OUT/build.log" | head -30; tail -15 "$OUT/build.log"; exit 1
fi
run() {  # NAME [VAR=VALUE...]
  local name=$1; shift
  local xs=() a
  for a in "$@"; do xs+=(-x "$a"); done   # mpirun -x VAR=VALUE sets it for the ranks
  "${MPIRUN[@]}" -np 2 -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET,P2P,SHM "${xs[@]}" \
    "$BUILD/lmscale" inputs/collectives_nccl.ini --bench.ops=all-reduce --bench.dtypes=fp32 \
    --run.output="$OUT/$name.h5" > "$OUT/$name.log" 2>&1
  echo "== $name (exit $?; $*): $(grep -oE 'via (P2P|SHM|NET)[^ ]*' "$OUT/$name.log" | sort | uniq -c | tr '\n' ' ')"
  grep -E '^all-reduce' "$OUT/$name.log"
}
run p2p
run shm NCCL_P2P_DISABLE=1
run socket NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
