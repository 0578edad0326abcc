#!/usr/bin/env bash
# The communication layer on 2 GPUs of one node (docs/collectives.md), in one run:
#   1. the 2-rank NCCL tests (mpirun -np 2 mpi_test_nccl_comm, label gpu) and the CPU mpi tests
#      with 2 ranks;
#   2. bench-collectives with the nccl backend (inputs/collectives_nccl.ini) and the torch peer
#      (torchrun ... collectives --backend nccl) side by side;
#   3. bench-collectives with the mpi backend, 2 ranks, 1 MB .. 1 GB (inputs/collectives_mpi.ini):
#      library (Open MPI without and with CMA single copy), ring, shm with 4/8/16 threads, and
#      the torch peer with gloo; then the same with 4 ranks (shm, library, gloo) if time allows;
#   4. a summary of both comparisons (the ratios docs/collectives.md quotes).
# Builds its targets with scripts/gpu/build.sh in $BUILD (a no-op when they are up to date). The
# torch peer is bench/torch_peer.py (pip install -r bench/requirements.txt); Open MPI's mpirun.
#   scripts/gpu/comm_2gpu.sh
# Logs and HDF5 files go to $OUT (default /tmp/comm_out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
OUT=${OUT:-/tmp/comm_out}
mkdir -p "$OUT"
PEER=${PEER:-bench/torch_peer.py}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
# --bind-to none: Open MPI binds each of <= 2 ranks to one core by default, which would leave the
# communication thread and the shm threads a single core.
# (MPIRUN and its flags come from scripts/gpu/env.sh.)

{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  nvidia-smi topo -m
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)|L3"
  free -g | head -2
} > "$OUT/machine.txt" 2>&1

# 0. build this script's targets (no-op when up to date)
if ! timeout 420 scripts/gpu/build.sh lmscale mpi_test_nccl_comm mpi_test_comm_collectives mpi_test_comm_async \
    mpi_test_comm_groups mpi_test_comm_check > "$OUT/build.log" 2>&1; then
  echo "build failed:"; grep -E "error|FAILED" "$OUT/build.log" | head -30; tail -15 "$OUT/build.log"; exit 1
fi
echo "build done at $(elapsed) s"
LMSCALE="$BUILD/lmscale"

# 1. tests
timeout 150 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/mpi/mpi_test_nccl_comm" > "$OUT/test_nccl_np2.log" 2>&1
echo "nccl tests (2 ranks, 2 GPUs): rc=$? at $(elapsed) s"
for t in collectives async groups check; do
  timeout 100 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/mpi/mpi_test_comm_$t" > "$OUT/test_mpi_${t}_np2.log" 2>&1
  echo "mpi test $t (2 ranks): rc=$?"
done

# 2. NCCL: lmscale and torch
timeout 150 "${MPIRUN[@]}" -np 2 "$LMSCALE" inputs/collectives_nccl.ini --run.output="$OUT/collectives_nccl.h5" \
  > "$OUT/bench_nccl.log" 2>&1
echo "bench nccl: rc=$? at $(elapsed) s"
timeout 120 torchrun --nproc-per-node 2 "$PEER" collectives --backend nccl > "$OUT/torch_nccl.log" 2>&1
echo "torch nccl: rc=$? at $(elapsed) s"

# 3. CPU: the mpi backend and torch gloo, 2 ranks
bench_mpi() {   # name, ranks, algo, extra mpirun options...
  local name=$1 np=$2 algo=$3; shift 3
  timeout 150 "${MPIRUN[@]}" -np "$np" "$@" "$LMSCALE" inputs/collectives_mpi.ini --bench.algo="$algo" \
    --run.output="$OUT/collectives_$name.h5" > "$OUT/bench_$name.log" 2>&1
  echo "bench $name: rc=$? at $(elapsed) s"
}
bench_mpi mpi_library_np2 2 library -x OMPI_MCA_btl_vader_single_copy_mechanism=none
bench_mpi mpi_library_cma_np2 2 library -x OMPI_MCA_btl_vader_single_copy_mechanism=cma
bench_mpi mpi_ring_np2 2 ring
for th in 4 8 16; do bench_mpi "mpi_shm${th}_np2" 2 shm -x LMSCALE_SHM_THREADS=$th; done
timeout 200 torchrun --nproc-per-node 2 "$PEER" collectives --backend gloo > "$OUT/torch_gloo_np2.log" 2>&1
echo "torch gloo (2 ranks): rc=$? at $(elapsed) s"
if [ "$(elapsed)" -lt 380 ]; then
  bench_mpi mpi_shm8_np4 4 shm -x LMSCALE_SHM_THREADS=8
  bench_mpi mpi_library_np4 4 library
  timeout 150 torchrun --nproc-per-node 4 "$PEER" collectives --backend gloo > "$OUT/torch_gloo_np4.log" 2>&1
  echo "torch gloo (4 ranks): rc=$? at $(elapsed) s"
fi

# 4. summary
echo "==== machine"; head -3 "$OUT/machine.txt"; grep -E "Model name|^CPU\(s\)|NUMA" "$OUT/machine.txt"
echo "==== nccl tests"; grep -aE "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|skipping|\[rank" "$OUT/test_nccl_np2.log" | head -20
for t in collectives async groups check; do
  echo "mpi $t: $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/test_mpi_${t}_np2.log" | tr '\n' ' ')"
done
echo "==== lmscale nccl";   grep -aE "^# bench|^op |^(all-|reduce|broad)" "$OUT/bench_nccl.log"; grep -aiE "error|FAIL" "$OUT/bench_nccl.log" | head -5
echo "==== torch nccl";     cat "$OUT/torch_nccl.log" | grep '^{' || tail -5 "$OUT/torch_nccl.log"
for f in "$OUT"/bench_mpi_*.log; do
  echo "==== $(basename "$f" .log)"; grep -aE "^(all-reduce)" "$f"; grep -aiE "error|FAIL|abort" "$f" | head -3
done
for f in "$OUT"/torch_gloo_np*.log; do echo "==== $(basename "$f" .log)"; grep '^{' "$f" || tail -5 "$f"; done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]

def ours(path, op="all-reduce", dtype="fp32"):
    rows = {}
    if not os.path.exists(path): return rows
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= 13 and f[0] == op and f[1] == dtype:
            rows[int(f[2])] = dict(us=float(f[6]), busbw=float(f[10]), result=f[12])
    return rows

def torch(path):
    rows = {}
    if not os.path.exists(path): return rows
    for line in open(path, errors="replace"):
        if line.startswith("{"):
            d = json.loads(line)
            rows[d["size_mb"] << 20] = dict(us=d["time_ms"] * 1e3, busbw=d["busbw_gbs"])
    return rows

print("==== NCCL all-reduce fp32: lmscale against torch")
a, t = ours(f"{out}/bench_nccl.log"), torch(f"{out}/torch_nccl.log")
print(f"{'bytes':>12} {'lmscale us':>11} {'torch us':>10} {'time ratio':>10} {'lmscale busbw':>14} {'torch busbw':>12} {'busbw ratio':>11}")
for b in sorted(set(a) & set(t)):
    x, y = a[b], t[b]
    print(f"{b:>12} {x['us']:>11.1f} {y['us']:>10.1f} {x['us']/y['us']:>10.2f} {x['busbw']:>14.2f} {y['busbw']:>12.2f} {x['busbw']/y['busbw']:>11.3f}")
for np_ in (2, 4):
    g = torch(f"{out}/torch_gloo_np{np_}.log")
    runs = {os.path.basename(p)[6:-4]: ours(p) for p in sorted(glob.glob(f"{out}/bench_mpi_*_np{np_}.log"))}
    if not g or not runs: continue
    print(f"==== mpi backend all-reduce fp32, {np_} ranks, against torch gloo")
    names = list(runs)
    print(f"{'bytes':>12} {'gloo':>7} " + " ".join(f"{n[:22]:>22}" for n in names))
    for b in sorted(g):
        cells = []
        for n in names:
            r = runs[n].get(b)
            cells.append(f"{r['busbw']:>8.2f} ({r['busbw']/g[b]['busbw']:>4.1f}x) {r['result']:>4}" if r else f"{'-':>22}")
        print(f"{b:>12} {g[b]['busbw']:>7.2f} " + " ".join(f"{c:>22}" for c in cells))
PY
echo "total $(elapsed) s"
