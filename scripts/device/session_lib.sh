# Sourced by the scripts/device/session_*.sh scripts after they set `stages` (the words given on
# the command line, or their default list): the environment every GPU run needs, the paths, the
# mpirun line, and the helpers that write the summary the device call returns.
#   has STAGE    the call asked for this stage
#   note TEXT    print and append to $OUT/summary.txt
#   brief LOG    one line for a bench-model log: step, phases, peak and predicted memory, fsdp waits
#   memrows H5   every rank's predicted and measured memory per phase of a bench-model output
#   p2p_summary TRACE   the peer copies of a run.trace, per rank
#   build_stage TARGETS...   the `build` stage (when asked for): ninja targets, errors and exit on failure
source scripts/device/env.sh
OUT=${OUT:-/tmp/session_out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-device}
LM=$BUILD/lmscale
PEER=.device/torch_peer.py
MPIRUN=(mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH)
T0=$(date +%s)
summary=$OUT/summary.txt
touch "$summary"
has() { [[ " $stages " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$summary"; }
brief() {
  local log=$1
  echo "$(grep -E '^step ' "$log" | awk '{print "step", $2, "+-", $3, "median", $6}')  fwd $(grep -E '^forward ' "$log" | awk '{print $2}') bwd $(grep -E '^backward ' "$log" | awk '{print $2}') opt $(grep -E '^optimizer ' "$log" | awk '{print $2}') $(grep -oE 'peak memory [0-9.]+ GiB' "$log") $(grep -oE 'predicted peak \(accounting\) [0-9.]+ GiB' "$log" | sed 's/(accounting) //') $(grep -oE 'MFU [0-9.]+%' "$log") $(grep -oE 'waited [0-9.]+ ms per step for all-gathers in the forward, [0-9.]+ ms in the backward' "$log")"
  grep -aiE "error|out of memory" "$log" | head -3
}
memrows() {   # FILE: every rank's predicted vs measured phases (rank 0 only without the ranks table)
  python3 - "$1" <<'PY' | tee -a "$summary"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
t = f["/bench_model/memory_prediction_ranks"] if "/bench_model/memory_prediction_ranks" in f else f["/bench_model/memory_prediction"]
for r in t[:]:
    d = {k: r[k] for k in r.dtype.names}
    ph = d["phase"].decode().rstrip("\0") if isinstance(d["phase"], bytes) else d["phase"]
    print(f"  rank {d.get('rank', 0)} {ph:<17} predicted {d['predicted_bytes']/2**30:8.3f} GiB measured {d['measured_bytes']/2**30:8.3f} GiB error {100*d['error']:+6.2f}%")
PY
}
p2p_summary() {   # TRACE.json: per rank, the peer copies of a run.trace (count, bytes, busy time, tracks)
  python3 - "$1" <<'PY' | tee -a "$summary"
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
cp = [e for e in ev if str(e.get("name", "")).startswith("peer copy")]
by = {}
for e in cp: by.setdefault(e.get("pid"), []).append(e)
for pid, es in sorted(by.items()):
    mb = sum(e.get("args", {}).get("bytes", 0) for e in es) / 2**20
    print(f"trace rank {pid}: {len(es)} peer copies, {mb:.0f} MiB, {sum(e.get('dur', 0) for e in es)/1e3:.1f} ms busy, tracks {sorted({e.get('tid') for e in es})}")
print("no peer copy events" if not cp else f"{len(cp)} peer copy events")
PY
}
build_stage() {   # TARGETS...
  has build || return 0
  scripts/device/build.sh "$@" > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
}
