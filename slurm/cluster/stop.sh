#!/usr/bin/env bash
# Stop a cluster started by slurm/cluster/start.sh and remove its directory.
#   slurm/cluster/stop.sh DIR        (KEEP=1 keeps DIR, e.g. to read the logs)
# Cancels all jobs and waits (up to 10 s) for the queue to empty, SIGTERMs munged, slurmctld and
# slurmd by the pids in DIR, SIGKILLs any still alive after 5 s, and kills leftover job
# processes (slurmstepd and its descendants) started by this cluster's slurmd.
# Only processes of this cluster are touched. A two-node cluster (SLURM_NODES=2) also loses its
# two network namespaces (listed in DIR/netns), and with them the veth pair.
set -uo pipefail

log() { echo "slurm-cluster: $*" >&2; }
[[ $# -eq 1 && -d $1 ]] || { log "usage: stop.sh DIR"; exit 1; }
D=$(cd "$1" && pwd)
export SLURM_CONF=$D/slurm.conf
pidfiles=("$D"/slurmd*.pid "$D/slurmctld.pid" "$D/munge/munged.pid")   # slurmd-NODE.pid with two nodes
netns=()
[[ -f $D/netns ]] && mapfile -t netns < "$D/netns"
# Clients reach slurmctld only from inside node 0's namespace in a two-node cluster.
ctl() { if [[ ${#netns[@]} -gt 0 ]]; then ip netns exec "${netns[0]}" "$@"; else "$@"; fi; }

# alive: exists and is not a zombie (an unreaped daemon still answers kill -0)
alive() { [[ -n $1 ]] && kill -0 "$1" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]; }
ctld=$(cat "$D/slurmctld.pid" 2>/dev/null || true)

# 1. cancel jobs, wait for the queue to drain
if [[ -f $SLURM_CONF ]] && alive "$ctld"; then
  jobs=$(ctl timeout 5 squeue -h -o %A 2>/dev/null | sort -u)
  if [[ -n $jobs ]]; then
    # shellcheck disable=SC2086
    ctl timeout 5 scancel $jobs 2>/dev/null || true
    for _ in $(seq 40); do
      [[ -z $(ctl timeout 2 squeue -h -o %A 2>/dev/null) ]] && break
      sleep 0.25
    done
  fi
fi

# 2. daemons: SIGTERM all at once, SIGKILL stragglers
pids=()
for f in "${pidfiles[@]}"; do
  p=$(cat "$f" 2>/dev/null || true)
  # only if the pid really is one of our daemons (pid files can outlive their process)
  if alive "$p" && grep -qsE 'munged|slurmctld|slurmd' "/proc/$p/comm"; then pids+=("$p"); fi
done
[[ ${#pids[@]} -gt 0 ]] && kill -TERM "${pids[@]}" 2>/dev/null
for _ in $(seq 50); do
  left=(); for p in "${pids[@]}"; do alive "$p" && left+=("$p"); done
  [[ ${#left[@]} -eq 0 ]] && break
  sleep 0.1
done
if [[ ${#left[@]} -gt 0 ]]; then
  log "SIGKILL ${left[*]}"; kill -KILL "${left[@]}" 2>/dev/null
fi

# 3. leftover job processes of this cluster: slurmstepd processes carry LMSCALE_SLURM_CLUSTER=DIR
#    (start.sh sets it for the daemons only) and the tasks are their descendants.
marker="LMSCALE_SLURM_CLUSTER=$D"
roots=()
for env in /proc/[0-9]*/environ; do
  p=${env#/proc/}; p=${p%/environ}
  [[ $p == "$$" ]] && continue
  { tr '\0' '\n' < "$env"; } 2>/dev/null | grep -qxF "$marker" && roots+=("$p")
done
if [[ ${#roots[@]} -gt 0 ]]; then
  victims=$(ps -e -o pid=,ppid= | awk -v roots="${roots[*]}" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
    { parent[$1] = $2 }
    END { for (p in parent) { q = p; while (q > 1) { if (q in keep) { print p; break } q = parent[q] } } }')
  for p in $victims; do
    [[ $p == "$$" ]] && continue
    log "killing leftover $({ tr '\0' ' ' < "/proc/$p/cmdline"; } 2>/dev/null | cut -c1-80) (pid $p)"
    kill -KILL "$p" 2>/dev/null
  done
fi

# 4. namespaces: nothing of this cluster runs in them any more; deleting them removes the veth pair
for ns in "${netns[@]}"; do
  [[ -n $ns && $ns == lmscale-* ]] || continue   # only names start.sh made
  ip netns del "$ns" 2>/dev/null || log "could not delete network namespace $ns"
done

if [[ -z ${KEEP:-} ]]; then
  # only a folder that start.sh made
  if [[ -f $D/.lmscale-slurm-cluster ]]; then
    rm -rf "$D"
  else
    log "not removing $D: start.sh did not make it"
  fi
fi
exit 0
