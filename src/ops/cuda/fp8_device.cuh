#pragma once
// The device side shared by the FP8 cast kernels (fp8.cu) and the producers' fused casts
// (fp8_producers.cu): the saturating conversion, delayed scaling's scale derived from the amax
// history inside a cast, and the last block's record of the amax (docs/precision.md).
#include <cuda_fp8.h>

#include <cstdint>

#include "../fp8_scale_rule.h"
#include "amax_reduce.cuh"
#include "kernel_utils.cuh"
#include "lmscale/ops/fp8.h"

namespace lmscale::ops::cuda::fp8_device {

template <Fp8Format F>
__device__ __forceinline__ std::uint8_t to_fp8(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// This thread's index in its block (blocks of 1 or 2 dims).
__device__ __forceinline__ int block_thread() { return threadIdx.x + threadIdx.y * blockDim.x; }
__device__ __forceinline__ bool first_block() { return blockIdx.x == 0 && blockIdx.y == 0; }
__device__ __forceinline__ unsigned grid_blocks() { return gridDim.x * gridDim.y; }

// The fused scale update's arguments (ops::Fp8HistoryUpdate on the device). work[0]: the amax
// accumulator, work[1]: the finished-block counter; both zero between launches.
struct HistoryArgs {
  float* history = nullptr;
  std::int64_t n = 0;
  std::int64_t record_slot = -1;
  float fp8_max = 0.f;
  int margin = 0;
  float* inv_scale = nullptr;
  std::uint32_t* work = nullptr;
  int* slot = nullptr;   // Fp8HistoryUpdate::slot: the record slot in device memory, advanced here
};

// Called by one whole warp: the history's maximum (NaN skipped: NaN compares false) and, when it
// is usable, the scale 2^k and true; else false (the scale keeps its value).
__device__ __forceinline__ bool history_scale(const HistoryArgs& h, float& scale, float& inv) {
  const int lane = block_thread() & 31;
  float a = 0.f;
  for (std::int64_t i = lane; i < h.n; i += 32) {
    const float v = h.history[i];
    if (v > a) a = v;
  }
  a = warp_max(a);   // no NaN left: fmaxf is an exact maximum
  if (!fp8_rule::usable_amax(a)) return false;
  const int k = fp8_rule::scale_exponent(a, h.fp8_max, h.margin);
  scale = fp8_rule::exp2i(k);
  inv = fp8_rule::exp2i(-k);
  return true;
}

// The scale a delayed cast uses, derived by every block from the history before any block writes
// to it (the amax is stored by the last block, after all have read): bitwise the value
// fp8_update_scale would have written. The first block stores it and its inverse; when the
// history has no usable amax no block writes and all read the kept scale. `shared`: one float.
__device__ __forceinline__ float derive_scale(const HistoryArgs& h, float* scale, float* shared) {
  if (block_thread() < 32) {
    float sc = 0.f, inv = 0.f;
    const bool usable = history_scale(h, sc, inv);
    if (block_thread() == 0) {
      if (usable && first_block()) {
        *scale = sc;
        *h.inv_scale = inv;
      }
      *shared = usable ? sc : *scale;
    }
  }
  __syncthreads();
  return *shared;
}

// The end of a fused kernel: this block's amax into work[0]; the last block to finish moves it
// into history[record_slot] (or the device slot, which it advances), zeroes the work words and, with kUpdate, sets scale and inv_scale
// from the whole history (fp8_update_scale). Every thread of the block calls it.
template <bool kUpdate>
__device__ __forceinline__ void finish_amax(std::uint32_t m, std::uint32_t* scratch, const HistoryArgs& h,
                                            float* scale) {
  __shared__ bool last;
  block_amax(m, scratch, &h.work[0]);
  if (block_thread() == 0) {
    __threadfence();   // this block's atomicMax before its count
    last = atomicAdd(&h.work[1], 1u) == grid_blocks() - 1;
  }
  __syncthreads();
  if (!last) return;
  if (block_thread() == 0) {
    __threadfence();
    const std::uint32_t bits = atomicExch(&h.work[0], 0u);
    atomicExch(&h.work[1], 0u);
    const std::int64_t at = h.slot ? *h.slot : h.record_slot;
    h.history[at] = __uint_as_float(bits);
    if (h.slot) *h.slot = static_cast<int>((at + 1) % h.n);
    __threadfence_block();
  }
  if constexpr (kUpdate) {
    __syncthreads();
    if (block_thread() < 32) {
      float sc = 0.f, inv = 0.f;
      if (history_scale(h, sc, inv) && block_thread() == 0) {
        *scale = sc;
        *h.inv_scale = inv;
      }
    }
  }
}

// The update's tensors as the kernels read them.
inline HistoryArgs history_args(const Fp8HistoryUpdate& u) {
  HistoryArgs h;
  h.history = u.amax_history.data_as<float>();
  h.n = u.amax_history.numel();
  h.record_slot = u.record_slot;
  h.fp8_max = fp8_max(u.format);
  h.margin = u.margin;
  h.inv_scale = u.inv_scale.data_as<float>();
  h.work = u.work.data_as<std::uint32_t>();
  h.slot = u.slot.defined() ? u.slot.data_as<int>() : nullptr;
  return h;
}

}  // namespace lmscale::ops::cuda::fp8_device
