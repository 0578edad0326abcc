#pragma once
// Device-side helpers shared by the CUDA kernels: dtype conversion to and from fp32, 16-byte
// vectors, block reductions, launch sizing and the dtype dispatch used by every op.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "alignment.h"   // is_aligned16: the callers of load_vec / store_vec check with it
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/dtype.h"
#include "lmscale/core/error.h"

namespace lmscale::ops::cuda {

// ---- fp32 <-> storage dtype -----------------------------------------------------------------
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(double x) { return static_cast<float>(x); }

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ double from_f32<double>(float x) { return x; }

// ---- 16-byte vectors ----------------------------------------------------------------------------
// kN elements of T in one 16-byte, 16-byte aligned chunk: loads and stores compile to LDG.128 /
// STG.128 when the address is 16-byte aligned (callers check with is_aligned16).
template <class T>
struct alignas(16) Vec {
  static constexpr int kN = static_cast<int>(16 / sizeof(T));
  T v[kN];
};
template <class T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T>*>(p);
}
template <class T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& x) {
  *reinterpret_cast<Vec<T>*>(p) = x;
}

// ---- reductions ---------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// The same in double (the MoE router's statistics: moe_router.cu).
__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_max(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result,
// the same bits every run (a fixed tree: each warp, then the warps' sums). T is float or double;
// `scratch` holds 32 T of shared memory; the trailing barrier lets callers reuse it.
template <class T>
__device__ __forceinline__ T block_sum(T x, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_sum(x);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : T(0);
  x = warp_sum(x);
  __syncthreads();
  return x;
}
__device__ __forceinline__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_max(x);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : -INFINITY;
  x = warp_max(x);
  __syncthreads();
  return x;
}

// ---- launch sizing ------------------------------------------------------------------------------
// Blocks for a grid-stride loop over `work` items with `threads` per block: enough to fill the
// device (`sms` multiprocessors, a few blocks each), never more than the work needs.
inline unsigned grid_for(std::int64_t work, int threads, int sms, int blocks_per_sm = 8) {
  const std::int64_t need = (work + threads - 1) / threads;
  const std::int64_t cap = static_cast<std::int64_t>(sms) * blocks_per_sm;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(need, cap)));
}

}  // namespace lmscale::ops::cuda

// Runs the statement with `T` bound to the CUDA element type of a floating DType (fp32, bf16,
// fp16); other dtypes throw naming the op.
#define LMSCALE_CUDA_DISPATCH_FLOAT(dtype, op_name, T, ...)                                               \
  do {                                                                                                    \
    switch (dtype) {                                                                                      \
      case ::lmscale::DType::f32: {                                                                       \
        using T = float;                                                                                  \
        __VA_ARGS__;                                                                                      \
        break;                                                                                            \
      }                                                                                                   \
      case ::lmscale::DType::bf16: {                                                                      \
        using T = __nv_bfloat16;                                                                          \
        __VA_ARGS__;                                                                                      \
        break;                                                                                            \
      }                                                                                                   \
      case ::lmscale::DType::f16: {                                                                       \
        using T = __half;                                                                                 \
        __VA_ARGS__;                                                                                      \
        break;                                                                                            \
      }                                                                                                   \
      default:                                                                                            \
        throw ::lmscale::Error(fmt::format("{}: dtype {} is not supported on CUDA (fp32, bf16, fp16 are)", \
                                           op_name, ::lmscale::dtype_name(dtype)));                       \
    }                                                                                                     \
  } while (0)

namespace lmscale::ops::cuda {

// ---- chunks of 8 elements ---------------------------------------------------------------------
// Elementwise kernels move 8 elements per thread and step: one 16-byte access for 16-bit types,
// two for fp32, four for fp64. kChunk divides every Vec<T>::kN multiple used here.
constexpr int kChunk = 8;
template <class T>
__device__ __forceinline__ void load_chunk(const T* p, float (&out)[kChunk]) {
#pragma unroll
  for (int j = 0; j < kChunk; j += Vec<T>::kN) {
    const Vec<T> v = load_vec(p + j);
#pragma unroll
    for (int e = 0; e < Vec<T>::kN; ++e) out[j + e] = to_f32(v.v[e]);
  }
}
template <class T>
__device__ __forceinline__ void store_chunk(T* p, const float (&in)[kChunk]) {
#pragma unroll
  for (int j = 0; j < kChunk; j += Vec<T>::kN) {
    Vec<T> v;
#pragma unroll
    for (int e = 0; e < Vec<T>::kN; ++e) v.v[e] = from_f32<T>(in[j + e]);
    store_vec(p + j, v);
  }
}

// Grid-stride indices of this thread: first index and stride, in int64 (flat buffers hold > 2^31
// elements).
__device__ __forceinline__ std::int64_t thread_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t thread_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace lmscale::ops::cuda
