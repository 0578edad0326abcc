#!/usr/bin/env bash
# Builds the CUDA attention test executable straight from its sources (no CMake, no Boost, none
# of the other layers): a quick loop for work on the attention kernels (sm_90a only; NVCC and the
# include paths below may need your system's). Usage: scripts/gpu/attention_build.sh OUTDIR  -> OUTDIR/test_attention_cuda and
# OUTDIR/ptxas.log (registers, shared memory, spills of every kernel).
set -euo pipefail
OUT=${1:?output directory}
mkdir -p "$OUT/obj"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ARCH="-gencode=arch=compute_90a,code=sm_90a"
INC="-Iinclude -I/usr/local/cuda/include -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/include/openblas"
CXXFLAGS="-std=c++20 -O3 -DNDEBUG -DLMSCALE_WITH_CUDA=1 $INC"
CU=(src/ops/cuda/flash_attention_fwd.cu src/ops/cuda/flash_attention_bwd.cu src/ops/cuda/flash_attention_bwd_dq.cu
    src/ops/cuda/flash_attention_simt.cu src/ops/cuda/flash_attention_sm90_fwd.cu src/ops/cuda/flash_attention_sm90_bwd.cu
    src/ops/cuda/attention_naive.cu)
CPP=(src/core/tensor.cpp src/core/trace.cpp src/core/host_allocator.cpp src/core/memory_tracker.cpp src/core/rng.cpp src/core/dtype.cpp
     src/core/cuda/device_allocator.cpp src/ops/runtime.cpp src/ops/cuda/runtime_state.cpp src/ops/cuda/resources.cpp src/ops/cuda/gemm.cpp
     src/ops/attention.cpp src/ops/cpu/attention_naive.cpp src/ops/cpu/flash_attention.cpp
     src/ops/cuda/flash_attention.cpp src/ops/cuda/flash_attention_sm90.cpp src/ops/cuda/attention_naive_host.cpp
     ctest/gpu/test_attention_cuda.cpp ctest/gpu/gpu_main.cpp)
pids=()
for f in "${CU[@]}"; do
  o="$OUT/obj/$(basename "$f").o"
  ( $NVCC $CXXFLAGS $ARCH -Xptxas -v -c "$f" -o "$o" > "$o.log" 2>&1 || { cat "$o.log"; exit 1; } ) & pids+=($!)
done
for f in "${CPP[@]}"; do
  o="$OUT/obj/$(echo "$f" | tr / _).o"
  ( g++ $CXXFLAGS -c "$f" -o "$o" 2> "$o.log" || { cat "$o.log"; exit 1; } ) & pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || { echo "attention build failed"; exit 1; }
cat "$OUT"/obj/*.cu.o.log > "$OUT/ptxas.log"
g++ -o "$OUT/test_attention_cuda" "$OUT"/obj/*.o -L/usr/local/cuda/lib64 -lcublasLt -lcublas -lcudart -lgtest -lopenblas \
  -lfmt -lpthread
echo "built $OUT/test_attention_cuda"
