#!/usr/bin/env bash
# preemption.sh LMSCALE DECK OUTDIR
# Preemption and rank failure on CPU (docs/checkpoints.md), tiny regression deck, 2 ranks, zero2:
#   R  the uninterrupted run of STEPS steps (the reference)
#   Q  the same run; once it has logged 20 steps, SIGTERM goes to ONE rank only -> every rank
#      stops at the same step boundary: exit 75, Q.h5 finished (renamed) with /train interrupted
#      = 1, a complete checkpoint at the stop step; resumed with train.resume = auto -> exit 0,
#      and Q's losses followed by the resumed run's equal R's bitwise
#   K  kill -9 of one rank mid-run -> the job ends non-zero within 60 s; the rows flushed before
#      (log_every = 1 flushes each) are readable in K.h5.tmp
#   H  one rank stopped (SIGSTOP, a hang) -> the other rank's watchdog (parallel.timeout_s = 5)
#      aborts the job within 60 s with ONE message naming the step and the stopped rank (which
#      cannot answer the watchdogs' side channel)
#   S  one rank sleeps inside a step (test-only LMSCALE_FAULT_SLEEP_*) -> ONE message naming it as
#      the rank that hangs outside communication while the other waits
set -uo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
steps=${STEPS:-2000}
rm -rf "$out/preempt"; mkdir -p "$out/preempt"; cd "$out/preempt" || exit 1
fail() { echo "FAIL: $*"; for f in *.log; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }
args=(--optim.cosine_steps="$steps" --train.steps="$steps" --parallel.zero=zero2 --run.progress=true
      --train.log_every=1 --optim.warmup_steps=3)
mpi() { mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 "$lmscale" "$deck" "${args[@]}" "$@"; }

# Starts the run in the background; returns once it has logged step 20 (pid in $job).
start_and_wait() {
  local log=$1; shift
  # mpirun itself in the background (not through a function: that would be a subshell), so that
  # $job is mpirun and its children are the ranks.
  mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 "$lmscale" "$deck" "${args[@]}" "$@" > "$log" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do
    grep -q "^step  *20/" "$log" && return 0
    kill -0 "$job" 2>/dev/null || fail "$log: the run ended before step 20"
    sleep 0.05
  done
  fail "$log: no step 20 after 30 s"
}
# One rank's pid: a child process of mpirun running lmscale.
one_rank() { pgrep -P "$job" | tail -n 1; }

mpi --run.output=R.h5 > R.log 2>&1 || fail "reference run exited $?"

start_and_wait Q.log --run.output=Q.h5 --train.checkpoint_dir=ck
rank=$(one_rank); [[ -n $rank ]] || fail "no rank process under mpirun $job"
kill -TERM "$rank"
wait "$job"; rc=$?
[[ $rc -eq 75 ]] || fail "SIGTERM to one rank: exit $rc, expected 75"
[[ -f Q.h5 && ! -e Q.h5.tmp ]] || fail "Q.h5 was not finished"
stop=$(python3 -c "
import h5py
with h5py.File('Q.h5') as f:
    g = f['/train']
    assert int(g.attrs['interrupted']) == 1, 'not marked interrupted'
    n = len(g['steps'])
    assert int(g.attrs['stopped_at_step']) == n, (int(g.attrs['stopped_at_step']), n)
    print(n)") || fail "Q.h5 attributes"
(( stop >= 20 && stop < steps )) || fail "stopped at step $stop"
[[ -f ck/$(printf 'step_%08d' "$stop")/index.h5 ]] || fail "no complete checkpoint at step $stop: $(ls ck)"
echo "ok: SIGTERM to one rank -> all stopped at step $stop, exit 75, checkpoint written"
mpi --run.output=Q2.h5 --train.checkpoint_dir=ck --train.resume=auto > Q2.log 2>&1 || fail "resume exited $?"
python3 "$here/compare_losses.py" R.h5 0 Q.h5 Q2.h5 || fail "resumed losses differ"
echo "ok: interrupted + resumed losses equal the uninterrupted run's bitwise"

start_and_wait K.log --run.output=K.h5
rank=$(one_rank)
t0=$SECONDS
kill -KILL "$rank"
wait "$job"; rc=$?
dt=$((SECONDS - t0))
[[ $rc -ne 0 ]] || fail "kill -9 of one rank: exit 0"
(( dt <= 60 )) || fail "kill -9 of one rank: the job took ${dt}s to end"
rows() { python3 -c "import h5py, sys; print(len(h5py.File(sys.argv[1])['/train/steps']))" "$1" 2>/dev/null || echo 0; }
(( $(rows K.h5.tmp) >= 20 )) || fail "K.h5.tmp does not hold the rows flushed before the failure"
echo "ok: kill -9 of one rank -> exit $rc after ${dt}s; $(rows K.h5.tmp) flushed rows readable in K.h5.tmp"

# H  one rank hangs (SIGSTOP): the other's watchdog (parallel.timeout_s = 5) ends the job.
start_and_wait H.log --run.output=H.h5 --parallel.timeout_s=5
rank=$(one_rank)
t0=$SECONDS
stopped=$(tr '\0' '\n' < "/proc/$rank/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
kill -STOP "$rank"
wait "$job"; rc=$?
dt=$((SECONDS - t0))
[[ $rc -ne 0 ]] || fail "a hung rank: exit 0"
(( dt <= 60 )) || fail "a hung rank: the job took ${dt}s to end"
grep -q "error: no progress for 5 s (parallel.timeout_s) in the train step of step" H.log || fail "H.log lacks the watchdog's message"
# ONE message, naming the stopped rank (its watchdog cannot answer the other's report).
(( $(grep -c "^lmscale: rank [0-9]*: error:" H.log) == 1 )) || fail "H.log: not exactly one error line"
[[ -z $stopped ]] || grep -q "rank $stopped did not answer" H.log || fail "H.log does not name the stopped rank $stopped"
(( $(rows H.h5.tmp) >= 20 )) || fail "H.h5.tmp does not hold the rows flushed before the failure"
kill -KILL "$rank" 2>/dev/null
echo "ok: SIGSTOP of one rank -> exit $rc after ${dt}s, $(rows H.h5.tmp) rows readable: $(grep -m1 'no progress' H.log)"

# S  one rank hangs inside a step (test-only fault injection: rank 1 sleeps at the start of step
#    25) while rank 0 waits for it in the gradient reduce-scatter: ONE message naming rank 1 as
#    the rank that hangs outside communication, within 60 s.
export LMSCALE_FAULT_SLEEP_RANK=1 LMSCALE_FAULT_SLEEP_STEP=25 LMSCALE_FAULT_SLEEP_S=600
start_and_wait S.log --run.output=S.h5 --parallel.timeout_s=5
t0=$SECONDS
wait "$job"; rc=$?
dt=$((SECONDS - t0))
unset LMSCALE_FAULT_SLEEP_RANK LMSCALE_FAULT_SLEEP_STEP LMSCALE_FAULT_SLEEP_S
[[ $rc -ne 0 ]] || fail "a sleeping rank: exit 0"
(( dt <= 60 )) || fail "a sleeping rank: the job took ${dt}s to end"
(( $(grep -c "^lmscale: rank [0-9]*: error:" S.log) == 1 )) || fail "S.log: not exactly one error line"
grep -q "rank 1 hangs outside communication (rank 1 in the train step of step 25) while rank 0 waits" S.log ||
  fail "S.log does not name rank 1 as the rank that hangs"
echo "ok: rank 1 asleep in step 25 -> exit $rc after ${dt}s: $(grep -m1 '^lmscale: rank [0-9]*: error:' S.log)"
echo PASS
