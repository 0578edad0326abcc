#!/usr/bin/env bash
# `make deps`: installs what building, running and testing lmscale needs on Debian 12, only when
# something is missing (a second run costs a few dpkg queries). Needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/../.."

debs=(build-essential cmake ninja-build pkg-config git
      libboost-program-options-dev libhdf5-dev hdf5-tools libopenblas-dev
      libopenmpi-dev openmpi-bin libfmt-dev libgtest-dev zlib1g-dev)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "make deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Slurm test cluster (ctest label slurm).
if [ -x scripts/deps/slurm.sh ]; then scripts/deps/slurm.sh; fi

# Python analysis scripts (ctest label analysis).
if [ -f analysis/requirements.txt ]; then
  if ! python3 -c "import h5py, pandas, matplotlib, safetensors" >/dev/null 2>&1; then
    echo "make deps: installing Python packages from analysis/requirements.txt"
    # Without a package index the install fails: the tests that need a missing package then fail
    # or report skipped (safetensors), instead of stopping every test here.
    python3 -m pip install -q -r analysis/requirements.txt ||
      echo "make deps: warning: pip could not install analysis/requirements.txt; the analysis tests that need it will say so"
  fi
fi
