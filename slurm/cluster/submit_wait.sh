#!/usr/bin/env bash
# Submit a job script and wait for it; print its exit code and exit with it.
#
#   slurm/cluster/submit_wait.sh JOBSCRIPT [sbatch args...] [-- script args...]
#
# sbatch --parsable, then polls squeue every 0.25 s (much faster than `sbatch --wait`, which backs
# off to ~10 s). The exit code comes from `scontrol show job` (this test cluster keeps no
# accounting, so no sacct); for a job array it is the highest over the array's tasks. A job
# killed by signal S gives 128+S; a job that ended FAILED/CANCELLED/TIMEOUT/... with code 0
# gives 1. Progress and per-task states go to stderr; stdout gets only the exit code.
# SUBMIT_WAIT_TIMEOUT=SECONDS cancels the job after that long and exits 124.
# Needs SLURM_CONF for a private cluster (source DIR/env from start.sh).
set -uo pipefail

log() { echo "submit_wait: $*" >&2; }
[[ $# -ge 1 ]] || { log "usage: submit_wait.sh JOBSCRIPT [sbatch args...] [-- script args...]"; exit 2; }
script=$1; shift
sb_args=() sc_args=()
while [[ $# -gt 0 ]]; do
  if [[ $1 == -- ]]; then shift; sc_args=("$@"); break; fi
  sb_args+=("$1"); shift
done

out=$(sbatch --parsable "${sb_args[@]}" "$script" "${sc_args[@]}") || { log "sbatch failed"; exit 1; }
job=${out%%;*}
log "submitted job $job ($(basename "$script"))"

t0=$SECONDS
limit=${SUBMIT_WAIT_TIMEOUT:-0}
while :; do
  q=$(squeue -h -j "$job" -o %i 2>/dev/null) || q=""   # an unknown (purged) job id is an error
  [[ -z $q ]] && break
  if (( limit > 0 && SECONDS - t0 >= limit )); then
    log "timeout after ${limit}s, cancelling job $job"
    scancel "$job" 2>/dev/null
    echo 124; exit 124
  fi
  sleep 0.25
done

# One record per job (one per array task); fields on one line with --oneliner.
recs=$(scontrol --oneliner show job "$job" 2>/dev/null)
if [[ -z $recs ]]; then log "job $job: no record left in slurmctld (MinJobAge passed?)"; echo 1; exit 1; fi

rc=0
while read -r rec; do
  [[ -z $rec ]] && continue
  id=$(sed -n 's/.*\bJobId=\([0-9]*\).*/\1/p' <<<"$rec")
  aj=$(sed -n 's/.*\bArrayJobId=\([0-9]*\).*/\1/p' <<<"$rec")
  at=$(sed -n 's/.*\bArrayTaskId=\([^ ]*\).*/\1/p' <<<"$rec")
  st=$(sed -n 's/.*\bJobState=\([A-Z_]*\).*/\1/p' <<<"$rec")
  ec=$(sed -n 's/.*\bExitCode=\([0-9]*:[0-9]*\).*/\1/p' <<<"$rec")
  code=${ec%%:*} sig=${ec##*:}
  : "${code:=1}" "${sig:=0}"
  if (( sig != 0 )); then r=$((128 + sig)); else r=$code; fi
  if [[ $st != COMPLETED && $r -eq 0 ]]; then r=1; fi
  name=$id; [[ -n $aj ]] && name="${aj}_${at} (id $id)"
  log "job $name: $st ExitCode=$ec -> $r"
  (( r > rc )) && rc=$r
done <<<"$recs"

log "job $job done in $((SECONDS - t0)) s, exit $rc"
echo "$rc"
exit "$rc"
