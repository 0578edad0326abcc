#pragma once
// The amax of a kernel's output, accumulated where the output is written (docs/precision.md,
// "Amaxes from the producers"): each thread keeps the maximum of fp8_rule::abs_bits over the
// values it stores, a block reduces them and one thread adds the block's maximum into a 1-element
// fp32 slot by an integer atomicMax on its bits. Exact and independent of the order (abs_bits
// orders like the values, NaN canonical and above +inf), so it equals ops::amax of the written
// tensor bit for bit. The slot must be zero before the kernel (the op zeroes it on its stream).
#include <cstdint>

#include "../fp8_scale_rule.h"
#include "kernel_utils.cuh"
#include "lmscale/core/tensor.h"

namespace lmscale::ops::cuda {

// abs_bits of the value `v` becomes when stored as T (the element ops::amax reads back).
template <class T>
__device__ __forceinline__ std::uint32_t stored_abs_bits(float v) {
  return fp8_rule::abs_bits(to_f32(from_f32<T>(v)));
}

// Stores out[0..8) at p as T (store_chunk) and adds their stored values' abs_bits into m.
template <class T>
__device__ __forceinline__ void store_chunk_amax(T* p, const float (&out)[kChunk], std::uint32_t& m) {
  store_chunk(p, out);
#pragma unroll
  for (int e = 0; e < kChunk; ++e) m = max(m, stored_abs_bits<T>(out[e]));
}

// Adds this block's maximum of `m` into *out (blocks of 1 or 2 dims, a multiple of 32 threads).
// Every thread of the block calls it; `scratch`: 32 words of shared memory, not otherwise in use
// at the call. A block whose maximum is 0 issues no atomic.
__device__ __forceinline__ void block_amax(std::uint32_t m, std::uint32_t* scratch, std::uint32_t* out) {
  const int t = threadIdx.x + threadIdx.y * blockDim.x, lane = t & 31, warp = t >> 5;
  const int warps = (blockDim.x * blockDim.y) >> 5;
  m = __reduce_max_sync(0xffffffffu, m);
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < warps ? scratch[lane] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0 && m != 0u) atomicMax(out, m);
  }
}

// The op's amax argument zeroed on `stream` (before its kernels atomicMax into it; a memset, which
// CUDA graph capture records like a kernel), as the kernels' pointer; null when not given.
inline std::uint32_t* zeroed_amax(cudaStream_t stream, Tensor* amax) {
  if (!amax) return nullptr;
  LMSCALE_CUDA_CHECK(cudaMemsetAsync(amax->data(), 0, 4, stream));
  return amax->data_as<std::uint32_t>();
}

}  // namespace lmscale::ops::cuda
