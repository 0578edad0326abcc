#!/usr/bin/env bash
# mpirun that passes lmscale's preemption exit code (75) on when it is itself asked to stop
# (docs/checkpoints.md, "Preemption under mpirun").
#
#   scripts/mpirun_stoppable.sh [mpirun options...] build/lmscale DECK [--section.key=value ...]
#
# Open MPI's mpirun (4.1), given SIGTERM itself, forwards it to the ranks, which write their
# checkpoint and exit 75, but then returns 1, and it refuses to forward SIGTERM as an ordinary
# signal (ess_base_forward_signals). SIGUSR1 it forwards by default, and lmscale treats SIGUSR1 as
# SIGTERM: the ranks exit 75 by themselves and mpirun returns 75. This wrapper runs mpirun and
# turns the first SIGTERM or SIGUSR1 it gets into SIGUSR1 for mpirun; a second SIGTERM is passed
# on as SIGTERM (mpirun then ends the ranks). Exit code: mpirun's. MPIRUN names another mpirun.
set -u
${MPIRUN:-mpirun} "$@" &   # in the background: bash runs its traps only between commands
pid=$!
asked=0
on_stop() {   # on_stop SIGNAL
  if [[ $asked -eq 0 || $1 == USR1 ]]; then
    asked=1
    kill -USR1 "$pid" 2>/dev/null
  else
    kill -TERM "$pid" 2>/dev/null
  fi
}
trap 'on_stop TERM' TERM
trap 'on_stop USR1' USR1
while :; do
  wait "$pid"; rc=$?
  kill -0 "$pid" 2>/dev/null || break   # a trap interrupted the wait: wait again
done
exit "$rc"
