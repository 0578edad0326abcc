#!/usr/bin/env bash
# On the dev machine: fetches Debian's Boost.Program_options 1.74 packages into .deps/ (ignored by
# git), to be carried to the GPU machine, which lacks the library (../shared/GPU.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deps
cd .deps
ls libboost1.74-dev_*.deb libboost-program-options1.74-dev_*.deb libboost-program-options1.74.0_*.deb >/dev/null 2>&1 \
  || apt-get download libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0
