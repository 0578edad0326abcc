# Sourced by the reliability case scripts (reliability.sh, reliability_checkpoints.sh) after they
# set lmscale, case_name and repo: a fresh temporary folder as the working directory, removed at
# exit with any background run; deck.ini, a tiny CPU train deck; and the helpers the cases share.
tmp=$(mktemp -d)
bg=""
cleanup() {
  [ -n "$bg" ] && kill -KILL "$bg" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
cd "$tmp" || exit 1
fail=0
check() {   # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what"
    fail=1
  fi
}
cat >deck.ini <<'INI'
[run]
job = train
progress = true
[model]
vocab_size = 64
context_length = 8
d_model = 16
d_ff = 32
num_layers = 1
num_heads = 2
[parallel]
device = cpu
[train]
steps = 2
batch_size = 2
log_every = 1
[data]
source = synthetic
INI
# run [ARGS...]: lmscale on deck.ini (or $DECK) with run.output = out.h5; rc in $rc.
run() {
  timeout 60 "$lmscale" "${DECK:-deck.ini}" --run.output=out.h5 "$@" >stdout 2>stderr
  rc=$?
}
# wait_for_exit PID SECONDS: rc of the background PID in $rc, or 124 after killing it (hung).
wait_for_exit() {
  local pid=$1 limit=$2 t
  for ((t = 0; t < limit * 10; t++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid"; wait "$pid" 2>/dev/null; rc=124; return; }
  wait "$pid"; rc=$?
}
# fill_disk PID: from now on, writes by PID past out.h5.tmp's present size fail (RLIMIT_FSIZE, the
# file-size limit, set on the running process: writes fail with EFBIG as on a full disk with
# ENOSPC; lmscale ignores SIGXFSZ, and so do the runs below, so that the code before that did is
# tested too). Set after start-up, since MPI's own shared-memory files exceed it.
# The limit holds for every regular file the process writes: the runs print no progress to stdout.
fill_disk() {
  prlimit --pid "$1" --fsize="$(stat -c %s out.h5.tmp)"
}
# wait_for_rows: until out.h5.tmp holds rows (flushed after the first step), and a second more.
wait_for_rows() {
  for _ in $(seq 300); do
    [ -s out.h5.tmp ] && break
    sleep 0.1
  done
  sleep 1
}
error_names() {   # error_names TEXT...: one 'lmscale: error:' line holds every TEXT
  local line
  line=$(grep -F 'lmscale: error:' stderr) || return 1
  for t in "$@"; do grep -qF -- "$t" <<<"$line" || return 1; done
}
expect_usage_error() {   # expect_usage_error KEY...: exit 2, one error line naming the keys, no results
  check "exit code $rc, expected 2" test "$rc" -eq 2
  check "an 'lmscale: error:' line names: $*" error_names "$@"
  check "out.h5 was not created" test ! -e out.h5
  check "out.h5.tmp was not created" test ! -e out.h5.tmp
}
is_hdf5() { head -c 4 "$1" 2>/dev/null | grep -q HDF; }
h5attr() {   # h5attr FILE GROUP ATTR
  python3 -c "import h5py, sys; print(h5py.File(sys.argv[1])[sys.argv[2]].attrs[sys.argv[3]])" "$@" 2>/dev/null
}

# finish_case: prints what the run said and exits 0 when every check passed.
finish_case() {
  echo "--- stderr:"; cat stderr 2>/dev/null | LC_ALL=C tr -c '[:print:]\n' '?'
  echo "--- stdout (tail):"; tail -5 stdout 2>/dev/null
  [ "$fail" -eq 0 ] && echo "PASS: $case_name"
  exit "$fail"
}
# wait_for_line FILE TEXT: until FILE holds TEXT (30 s at most).
wait_for_line() {
  for _ in $(seq 300); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
