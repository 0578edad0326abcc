#!/usr/bin/env bash
# Start a private one-node Slurm cluster (Slurm 22.05, Debian 12) for tests and local trials.
#
#   slurm/cluster/start.sh [DIR]      -> prints DIR on stdout; source DIR/env to use the cluster
#   slurm/cluster/stop.sh DIR
#
# Runs as root, needs no systemd: a private munged (own key and socket), slurmctld and slurmd,
# all state, logs and pid files under DIR (created with mktemp when not given), free TCP ports
# chosen at start-up, so several clusters can run side by side and the system's munge/slurm
# (if any) are left alone. The node has the machine's CPUs (from `slurmd -C`), one partition
# `ci`, MpiDefault=pmix. Waits until the node is idle (START_TIMEOUT seconds, default 20); on
# failure prints the logs, stops what it started and exits 1.
#
# Environment: START_TIMEOUT (s); SLURMD_TIMEOUT (s, default 30: how long a silent node stays up
# before slurmctld marks it down; the elastic test shortens it); SLURM_CPUS=N declares N CPUs per node (default: the hardware's;
# more oversubscribes on purpose, SlurmdParameters=config_overrides); SLURM_GPUS=N adds Gres=gpu:N and a gres.conf for
# /dev/nvidia[0..N-1] (Debian ships no gpu_nvml plugin); on a machine without /dev/nvidia0 the
# device files are faked under DIR/dev, enough to schedule and test GPU job scripts.
#
# SLURM_NODES=2: two nodes on this one machine, each a network namespace of its own (plus its own
# UTS namespace for a distinct host name and mount namespace for a private TmpFS), joined by a
# veth pair with addresses private to the pair (10.219.0.1 and 10.219.0.2 by default, no route
# anywhere else). slurmctld and the first slurmd live in node 0's namespaces, the second slurmd in
# node 1's; munged (unix socket on the file system) is shared. Clients must run inside node 0's
# network namespace: DIR/run CMD... does that (DIR/env exports SLURM_CONF as before). Node names
# are lms<tag>-0 and lms<tag>-1, tag from DIR's random suffix, so concurrent clusters (and Open
# MPI's per-host session directories) never collide. See slurm/README.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "slurm-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (SlurmUser=root)"
for c in munged mungekey slurmctld slurmd sinfo scontrol; do
  command -v "$c" >/dev/null || die "missing $c: run scripts/deps/slurm.sh"
done

nodes=${SLURM_NODES:-1}
[[ $nodes == 1 || $nodes == 2 ]] || die "SLURM_NODES=$nodes: only 1 or 2 nodes are supported"
if (( nodes == 2 )); then
  for c in ip unshare nsenter hostname; do command -v "$c" >/dev/null || die "missing $c: run scripts/deps/slurm.sh"; done
fi

if [[ $# -ge 1 && -n $1 ]]; then
  # stop.sh removes D: never adopt a folder that holds anything
  if [[ -e $1 && -n $(ls -A "$1" 2>/dev/null) ]]; then die "$1 exists and is not empty"; fi
  D=$1; mkdir -p "$D"
else
  D=$(mktemp -d "${TMPDIR:-/tmp}/lmscale-slurm.XXXXXX")
fi
D=$(cd "$D" && pwd)
# munged's socket path must fit in sun_path (108 bytes)
(( ${#D} <= 80 )) || die "path too long for a unix socket: $D (use a shorter DIR or TMPDIR)"
mkdir -p "$D"/{munge,state,spool,tmp,log}
touch "$D/.lmscale-slurm-cluster"   # lets stop.sh remove D
started=1
# munged insists on safe permissions along its paths; slurmd/job steps need to enter D.
chmod 0755 "$D" "$D/log" "$D/state" "$D/spool" "$D/tmp"
chmod 0711 "$D/munge"

on_fail() {
  local rc=$?
  if [[ $rc -ne 0 && ${started:-0} -eq 1 ]]; then
    for f in "$D"/log/*; do [[ -s $f ]] && { echo "===== $f" >&2; tail -n 40 "$f" >&2; }; done
    "$here/stop.sh" "$D" >&2 || true
  fi
}
trap on_fail EXIT

# --- free ports: random in 20000-31999 (below the ephemeral range), not bound by anyone ---
port_free() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket,sys; s=socket.socket(); s.bind(("", int(sys.argv[1])))' "$1" 2>/dev/null
  else
    [[ -z $(ss -Htan "sport = :$1" 2>/dev/null) ]]
  fi
}
pick_ports() {
  local ports=() p
  while (( ${#ports[@]} < 2 )); do
    p=$((20000 + RANDOM % 12000))
    [[ " ${ports[*]} " == *" $p "* ]] && continue
    port_free "$p" && ports+=("$p")
  done
  echo "${ports[@]}"
}

host=$(hostname -s)
ctl_addr=127.0.0.1
node_names=("$host") node_addrs=(127.0.0.1) netns=()
if (( nodes == 2 )); then
  # Names from D's random suffix: unique per cluster, valid as host names and Slurm node names.
  tag=$(basename "$D" | sed 's/.*\.//' | tr 'A-Z' 'a-z' | tr -cd 'a-z0-9')
  node_names=("lms$tag-0" "lms$tag-1")
  net=${SLURM_NODES_NET:-10.219.0}   # a /24 that exists only on the veth pair inside the namespaces
  node_addrs=("$net.1" "$net.2")
  netns=("lmscale-$tag-0" "lmscale-$tag-1")
  ctl_addr=${node_addrs[0]} host=${node_names[0]}
fi
# The node as slurmd sees it (CPUs and topology must not exceed the hardware or the node drains).
hw=$(slurmd -C | head -n 1)
node_hw=""
for k in CPUs Boards SocketsPerBoard CoresPerSocket ThreadsPerCore; do   # no RealMemory: memory is not scheduled here
  v=$(sed -n "s/.*\b$k=\([0-9]*\).*/\1/p" <<<"$hw")
  [[ -n $v ]] && node_hw+=" $k=$v"
done
[[ $node_hw == *CPUs=* ]] || node_hw=" CPUs=$(nproc)"
cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node_hw")
[[ ${SLURMD_TIMEOUT:-30} =~ ^[1-9][0-9]*$ ]] || die "SLURMD_TIMEOUT=$SLURMD_TIMEOUT: not a positive number of seconds"
overrides=""
if [[ -n ${SLURM_CPUS:-} ]]; then
  # More CPUs than the machine has (benchmarks that oversubscribe on purpose, e.g. 4 ranks of one
  # node on 2 cores): slurmd takes the configured count instead of draining the node.
  [[ $SLURM_CPUS =~ ^[1-9][0-9]*$ ]] || die "SLURM_CPUS=$SLURM_CPUS: not a positive count"
  node_hw=" CPUs=$SLURM_CPUS" cpus=$SLURM_CPUS overrides="SlurmdParameters=config_overrides"
fi

gres_line="" gres_node=""
if [[ -n ${SLURM_GPUS:-} && ${SLURM_GPUS} -gt 0 ]]; then
  gres_line="GresTypes=gpu"
  gres_node="Gres=gpu:${SLURM_GPUS}"
  gpu_dev=/dev/nvidia
  if [[ ! -e /dev/nvidia0 ]]; then
    # no GPUs here: fake device files, so GPU job scripts can still be scheduled and tested
    gpu_dev=$D/dev/nvidia
    mkdir -p "$D/dev"
    for ((i = 0; i < SLURM_GPUS; i++)); do ln -s /dev/null "$gpu_dev$i"; done   # must be char devices
    log "no /dev/nvidia0: $SLURM_GPUS fake GPUs in $D/dev (scheduling only)"
  fi
  echo "Name=gpu File=${gpu_dev}[0-$((SLURM_GPUS - 1))]" > "$D/gres.conf"
fi

# One slurm.conf for all nodes: with two slurmds on one machine their spool, pid and log paths
# take the node name (%n, expanded by slurmd).
node_sfx="" node_lines=""
(( nodes == 2 )) && node_sfx="-%n"
for i in "${!node_names[@]}"; do
  node_lines+="NodeName=${node_names[$i]} NodeAddr=${node_addrs[$i]} NodeHostname=${node_names[$i]}${node_hw} $gres_node State=UNKNOWN"$'\n'
done
write_conf() {  # $1 ctld port, $2 slurmd port
  cat > "$D/slurm.conf" <<CONF
# generated by slurm/cluster/start.sh
ClusterName=lmscale-ci
SlurmctldHost=${host}(${ctl_addr})
SlurmctldPort=$1
SlurmdPort=$2
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool$node_sfx
TmpFS=$D/tmp
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd$node_sfx.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd$node_sfx.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
MailProg=/bin/true
$overrides
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=${SLURMD_TIMEOUT:-30}
InactiveLimit=0
KillWait=5
$gres_line
${node_lines}PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

export SLURM_CONF=$D/slurm.conf
# Marks the daemons and their slurmstepds so stop.sh can find leftovers of this cluster only.
export LMSCALE_SLURM_CLUSTER=$D
echo "export SLURM_CONF=$SLURM_CONF" > "$D/env"

# --- munged: private key and socket ---
mungekey --create --keyfile="$D/munge/munge.key" >/dev/null 2>&1 \
  || dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$D/munge/munge.key"
munged --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" \
  --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.log" \
  --seed-file="$D/munge/munged.seed" --num-threads=2 </dev/null >>"$D/log/munged.out" 2>&1 \
  || die "munged failed to start"

# --- two nodes: network namespaces joined by a veth pair ---
# in_node I CMD...: CMD as a process of node I: its network namespace, plus fresh UTS and mount
# namespaces in which the host name is the node's name (MPI_Get_processor_name, /system/ranks)
# and D/tmp (TmpFS: Slurm's pmix plugin puts per-step folders there, named by job and step only)
# is the node's own folder. Daemons keep these namespaces, and so do the job steps they fork.
in_node() {
  local i=$1; shift
  # nsenter, not `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup, and slurmd
  # will not start without it.
  nsenter --net="/run/netns/${netns[$i]}" unshare --uts --mount --propagation private \
    sh -c 'hostname "$1" && mount --bind "$2" "$3" && shift 3 && exec "$@"' in_node \
    "${node_names[$i]}" "$D/node-${node_names[$i]}/tmp" "$D/tmp" "$@"
}
# ctl CMD...: a client command where it can reach slurmctld (node 0's network namespace).
ctl() { if (( nodes == 2 )); then ip netns exec "${netns[0]}" "$@"; else "$@"; fi; }
if (( nodes == 2 )); then
  printf '%s\n' "${netns[@]}" > "$D/netns"   # stop.sh deletes them
  for i in 0 1; do
    ip netns add "${netns[$i]}" || die "cannot create network namespace ${netns[$i]} (needs root and CAP_SYS_ADMIN)"
    mkdir -p "$D/node-${node_names[$i]}/tmp" "$D/spool-${node_names[$i]}"
    chmod 0755 "$D/node-${node_names[$i]}" "$D/node-${node_names[$i]}/tmp" "$D/spool-${node_names[$i]}"
  done
  # Made directly inside the two namespaces: the root namespace never sees the link or its
  # addresses, and neither namespace has a route anywhere else.
  ip link add ci0 netns "${netns[0]}" type veth peer name ci0 netns "${netns[1]}" || die "cannot create the veth pair"
  for i in 0 1; do
    ip -n "${netns[$i]}" link set lo up
    ip -n "${netns[$i]}" addr add "${node_addrs[$i]}/24" dev ci0
    ip -n "${netns[$i]}" link set ci0 up
  done
  ip netns exec "${netns[0]}" ping -c 1 -W 2 "${node_addrs[1]}" >/dev/null 2>&1 \
    || { command -v ping >/dev/null && die "node 0 cannot reach node 1 over the veth pair"; }
  printf '#!/bin/sh\n# run a Slurm client inside this cluster (node 0 network namespace)\nSLURM_CONF=%s exec ip netns exec %s "$@"\n' \
    "$D/slurm.conf" "${netns[0]}" > "$D/run"
  chmod 0755 "$D/run"
fi

# --- slurmctld + slurmd; retry with fresh ports if one was taken in the meantime ---
slurmd_logs() { ls "$D"/log/slurmd*.log 2>/dev/null; }
wait_idle() {  # returns 0 idle, 1 timeout, 2 port clash
  local deadline=$((SECONDS + ${START_TIMEOUT:-20})) st
  while (( SECONDS < deadline )); do
    # shellcheck disable=SC2046
    if grep -qs 'Address already in use' "$D/log/slurmctld.log" $(slurmd_logs); then return 2; fi
    # one state per node; all must be idle
    st=$(ctl timeout 2 sinfo -h -N -o %t 2>/dev/null | sort -u | tr '\n' ' ' || true)
    [[ $st == "idle " && $(ctl timeout 2 sinfo -h -N -o %N 2>/dev/null | wc -l) -eq $nodes ]] && return 0
    sleep 0.05
  done
  log "node state after ${START_TIMEOUT:-20} s: '${st:-none}'"
  return 1
}
start_daemons() {
  if (( nodes == 1 )); then
    slurmctld -i -f "$SLURM_CONF" </dev/null >>"$D/log/slurmctld.out" 2>&1 || die "slurmctld failed to start"
    slurmd -f "$SLURM_CONF" </dev/null >>"$D/log/slurmd.out" 2>&1 || die "slurmd failed to start"
  else
    in_node 0 slurmctld -i -f "$SLURM_CONF" </dev/null >>"$D/log/slurmctld.out" 2>&1 || die "slurmctld failed to start"
    for i in 0 1; do
      in_node "$i" slurmd -f "$SLURM_CONF" -N "${node_names[$i]}" </dev/null >>"$D/log/slurmd-${node_names[$i]}.out" 2>&1 \
        || die "slurmd of ${node_names[$i]} failed to start"
    done
  fi
}
kill_daemons() {
  local f p
  for f in "$D"/slurmd*.pid "$D/slurmctld.pid"; do
    p=$(cat "$f" 2>/dev/null || true); if [[ -n $p ]]; then kill "$p" 2>/dev/null || true; fi
  done
  sleep 2
  for f in "$D"/slurmd*.pid "$D/slurmctld.pid"; do
    p=$(cat "$f" 2>/dev/null || true); if [[ -n $p ]]; then kill -9 "$p" 2>/dev/null || true; fi
    rm -f "$f"
  done
}

for attempt in 1 2 3; do
  read -r ctld_port slurmd_port < <(pick_ports)
  write_conf "$ctld_port" "$slurmd_port"
  start_daemons
  rc=0; wait_idle || rc=$?
  [[ $rc -eq 0 ]] && break
  [[ $rc -eq 2 && $attempt -lt 3 ]] || die "cluster did not become idle"
  log "port clash on $ctld_port/$slurmd_port, retrying"
  kill_daemons
  mv "$D/log/slurmctld.log" "$D/log/slurmctld.log.$attempt" 2>/dev/null || true
  for f in $(slurmd_logs); do mv "$f" "$f.$attempt"; done
done

if (( nodes == 1 )); then
  log "up in $D (ports $ctld_port/$slurmd_port, node $host CPUs=$cpus${gres_node:+ $gres_node}); source $D/env"
else
  log "up in $D: nodes ${node_names[*]} at ${node_addrs[*]} (namespaces ${netns[*]}; ports $ctld_port/$slurmd_port" \
      "inside them), CPUs=$cpus each${gres_node:+ $gres_node}; source $D/env, run clients with $D/run CMD"
fi
trap - EXIT
echo "$D"
