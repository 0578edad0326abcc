# Shared by bench/study_*.sh (sourced, not run). A study runs lmscale and the PyTorch peer on the
# same GPUs, one after the other, REPEATS times in alternation (so drift hits both), keeps every
# run's output under $OUT/<case>/, and prints one ratio table (bench/ratio_table.py).
#
# Environment (all optional):
#   LMSCALE   the lmscale executable (default build/lmscale)
#   PYTHON    python with bench/requirements.txt installed (default python3)
#   TORCHRUN  torchrun of that python (default torchrun)
#   MPIRUN    MPI launcher (default mpirun); MPIRUN_FLAGS its flags (default, Open MPI:
#             --bind-to none -x NCCL_NVLS_ENABLE=0; MPICH: -genv NCCL_NVLS_ENABLE 0)
#   REPEATS   runs of each side (default 3); OUT: where outputs go (default outputs/bench/<study>)
#   DRY_RUN=1 print the commands instead of running them
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$BENCH_DIR/.."
LMSCALE=${LMSCALE:-build/lmscale}
PYTHON=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-torchrun}
MPIRUN=${MPIRUN:-mpirun}
read -r -a MPIRUN_ARGS <<< "${MPIRUN_FLAGS:---bind-to none -x NCCL_NVLS_ENABLE=0}"
REPEATS=${REPEATS:-3}
OUT=${OUT:-outputs/bench/$STUDY}
DRY_RUN=${DRY_RUN:-}
# NVLink multicast stays off on shared multi-GPU hosts (docs/architecture.md §3): lmscale sets it
# itself; the peer's NCCL reads it from here.
export NCCL_NVLS_ENABLE=0
ROWS=()
RUN=0

say() { echo "[$STUDY] $*" >&2; }

preflight() {
  [ -n "$DRY_RUN" ] && return 0
  if [ ! -x "$LMSCALE" ]; then say "no lmscale at $LMSCALE (build it, or set LMSCALE)"; exit 2; fi
  if ! "$PYTHON" -c "import torch, h5py, numpy" 2>/dev/null; then
    say "$PYTHON lacks torch, h5py or numpy: pip install -r bench/requirements.txt"; exit 2
  fi
  local need=${1:-1} have
  have=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
  if [ "$have" -lt "$need" ]; then say "needs $need GPUs, sees $have"; exit 2; fi
}

# run_logged STDOUT STDERR CMD...: run CMD (or print it under DRY_RUN). A failed run is reported
# and leaves no value for the table (its row shows "-"); the study goes on.
run_logged() {
  local stdout=$1 stderr=$2 rc=0; shift 2
  if [ -n "$DRY_RUN" ]; then echo "$*"; return 0; fi
  "$@" > "$stdout" 2> "$stderr" || rc=$?
  if [ "$rc" -ne 0 ]; then say "failed (exit $rc): $* -- see $stderr"; fi
  return 0
}

case_dir() {
  local dir="$OUT/$1"
  mkdir -p "$dir"
  echo "$dir"
}

# clear_case CASE: the first time this invocation touches CASE (lmscale or the peer, whichever
# comes first), removes what an earlier invocation left in its folder; later runs and the other
# side add to it. Cases this invocation does not run keep their results. Called by lm and peer
# in the script's own shell (not in case_dir's subshell, which could not remember it).
declare -A CLEARED_CASES=()
clear_case() {
  [ -n "${CLEARED_CASES[$1]:-}" ] && return 0
  CLEARED_CASES[$1]=1
  [ -n "$DRY_RUN" ] && return 0
  rm -f "$OUT/$1"/lmscale_*.h5 "$OUT/$1"/lmscale_*.log "$OUT/$1"/peer_*.jsonl "$OUT/$1"/peer_*.log
}

# lm CASE NP DECK [--key=value ...]: lmscale on NP ranks (one per GPU), output $OUT/CASE/lmscale_RUN.h5
lm() {
  local name=$1 np=$2 deck=$3; shift 3
  clear_case "$name"
  local dir; dir=$(case_dir "$name")
  local launch=("$LMSCALE")
  if [ "$np" -gt 1 ]; then launch=("$MPIRUN" -np "$np" "${MPIRUN_ARGS[@]}" "$LMSCALE"); fi
  say "run $RUN/$REPEATS $name: lmscale $deck $*"
  run_logged "$dir/lmscale_$RUN.log" "$dir/lmscale_$RUN.err.log" \
    "${launch[@]}" "$deck" --run.output="$dir/lmscale_$RUN.h5" "$@"
}

# peer CASE NP MODE [args ...]: bench/torch_peer.py on NP processes (torchrun), JSON in $OUT/CASE/peer_RUN.jsonl
peer() {
  local name=$1 np=$2; shift 2
  clear_case "$name"
  local dir; dir=$(case_dir "$name")
  local launch=("$PYTHON")
  if [ "$np" -gt 1 ]; then launch=("$TORCHRUN" --standalone --nproc-per-node "$np"); fi
  say "run $RUN/$REPEATS $name: peer $*"
  run_logged "$dir/peer_$RUN.jsonl" "$dir/peer_$RUN.log" "${launch[@]}" bench/torch_peer.py "$@"
}

# repeat FUNCTION: call FUNCTION once per run, RUN = 1..REPEATS
repeat() {
  for RUN in $(seq 1 "$REPEATS"); do "$1"; done
}

# row LABEL UNIT LM_CASE LM_METRIC PEER_CASE PEER_FIELD [LM_FILTER [PEER_FILTER]]: a table row
row() {
  ROWS+=(--row "$1" "$2" "$OUT/$3/lmscale_*.h5::$4::${7:-}" "$OUT/$5/peer_*.jsonl::$6::${8:-}")
}

# step_rows LABEL LM_CASE PEER_CASE: the usual pair of rows of a bench-model comparison
step_rows() {
  row "$1: step" ms "$2" /bench_model@total_ms_median "$3" step_ms
  row "$1: peak memory" GiB "$2" /bench_model@peak_bytes "$3" peak_gib
}

print_table() {
  local title="$1 ($REPEATS runs each; outputs in $OUT)"
  if [ -n "$DRY_RUN" ]; then echo "$PYTHON bench/ratio_table.py --title '$title' ${ROWS[*]}"; return 0; fi
  "$PYTHON" bench/ratio_table.py --title "$title" "${ROWS[@]}"
}
