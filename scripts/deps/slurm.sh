#!/usr/bin/env bash
# Install the Debian packages the Slurm job scripts and the local test cluster need
# (slurm/cluster/start.sh, ctest/slurm). Idempotent and quiet: does nothing when all are present.
#   slurmd slurmctld slurm-client  Slurm 22.05 daemons and clients (sbatch, srun, squeue, ...)
#   libpmix-dev                    ships .../pmix2/lib/libpmix.so, which Slurm's mpi/pmix plugin loads
#   munge                          authentication daemon (the test cluster runs a private one)
#   iproute2 util-linux            ip (network namespaces, veth), unshare and nsenter: the two-node
#                                  test cluster (SLURM_NODES=2, ctest slurm.multi_node)
set -euo pipefail

pkgs=(slurmd slurmctld slurm-client libpmix-dev munge iproute2 util-linux)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

SUDO=
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "slurm.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi

echo "slurm.sh: installing ${missing[*]}" >&2
$SUDO apt-get update -qq >/dev/null
# The packages do not need their system daemons: slurm/cluster/start.sh runs private ones.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
