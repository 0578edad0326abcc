#!/usr/bin/env bash
# Builds lmscale on the GPU machine (../shared/GPU.md, "build on the device"). Run from the repo
# root inside a device call that carries `.deps` (Debian's Boost 1.74 .debs, fetched by
# scripts/device/fetch_deps.sh on the dev machine): the device has Boost headers but no
# libboost_program_options. Usage: scripts/device/build.sh [ninja targets...]
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -f /opt/deps/usr/include/boost/version.hpp ]; then
  mkdir -p /opt/deps
  for f in .deps/*.deb; do dpkg -x "$f" /opt/deps; done
fi
# CTest files hold absolute paths of the dev machine's checkout; make them resolve here too.
mkdir -p /work && [ -e /work/main ] || ln -sfn "$PWD" /work/main
BUILD=${BUILD:-build-device}
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLMSCALE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
    -DBoost_DIR=/opt/deps/usr/lib/x86_64-linux-gnu/cmake/Boost-1.74.0 \
    -Dboost_program_options_DIR=/opt/deps/usr/lib/x86_64-linux-gnu/cmake/boost_program_options-1.74.0 \
    -Dboost_headers_DIR=/opt/deps/usr/lib/x86_64-linux-gnu/cmake/boost_headers-1.74.0 > "$BUILD.configure.log" 2>&1 \
    || { cat "$BUILD.configure.log"; exit 1; }
fi
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ninja -C "$BUILD" -j"$(nproc)" "$@"
