#!/usr/bin/env bash
# Configures (the first time) and builds lmscale with its CUDA backend in $BUILD (default build).
#   scripts/gpu/build.sh                          # everything: lmscale and every test
#   scripts/gpu/build.sh lmscale test_ops_cuda_math
# CUDA_ARCHS sets CMAKE_CUDA_ARCHITECTURES (default 80;90a: Ampere and Hopper; 90a alone compiles
# faster), CMAKE_ARGS adds CMake options (e.g. dependencies from Spack or modules: docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLMSCALE_CUDA=ON \
    ${CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS} ${CMAKE_ARGS:-}
fi
targets=(); [ $# -gt 0 ] && targets=(--target "$@")
cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}"
