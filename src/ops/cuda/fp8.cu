// amax, cast_fp8, transpose_fp8 and fp8_update_scale on CUDA (lmscale/ops/fp8.h). The scalar rules
// are ops/fp8_scale_rule.h's, shared with the CPU reference; the conversion is the hardware's
// cvt.rn.satfinite (__nv_cvt_float_to_fp8 with __NV_SATFINITE, sm_89+), which the gpu tests hold
// against core/fp8.h bit for bit.
#include <cuda_fp8.h>

#include "../fp8_scale_rule.h"
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {
namespace {

constexpr int kThreads = 256;

template <Fp8Format F>
__device__ __forceinline__ std::uint8_t to_fp8(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// Adds this block's amax bits (fp8_rule::abs_bits) into *out by an integer atomic maximum: exact
// and independent of the order. `scratch`: 32 words of shared memory.
__device__ __forceinline__ void block_amax(std::uint32_t m, std::uint32_t* scratch, std::uint32_t* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  m = __reduce_max_sync(0xffffffffu, m);
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < warps ? scratch[lane] : 0u;
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0 && m != 0u) atomicMax(out, m);
  }
}

template <class T>
__global__ void amax_kernel(const T* __restrict__ x, std::int64_t n, std::uint32_t* __restrict__ out) {
  __shared__ std::uint32_t scratch[32];
  std::uint32_t m = 0;
  for (std::int64_t i = thread_index(), step = thread_stride(); i < n; i += step)
    m = max(m, fp8_rule::abs_bits(to_f32(x[i])));
  block_amax(m, scratch, out);
}

// out[i] = fp8(fp32(x[i]) * scale). Chunks of 8 elements (16-byte loads of x, one 8-byte store)
// where x is 16-byte and out 8-byte aligned; the rest one by one.
template <class T, Fp8Format F, bool kAmax>
__global__ void cast_fp8_kernel(const T* __restrict__ x, const float* __restrict__ scale, std::uint8_t* __restrict__ out,
                                std::int64_t n, std::int64_t chunks, std::uint32_t* __restrict__ amax_out) {
  __shared__ std::uint32_t scratch[32];
  const float s = *scale;
  std::uint32_t m = 0;
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < chunks; c += step) {
    float v[kChunk];
    load_chunk(x + c * kChunk, v);
    alignas(8) std::uint8_t q[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      if constexpr (kAmax) m = max(m, fp8_rule::abs_bits(v[e]));
      q[e] = to_fp8<F>(v[e] * s);
    }
    *reinterpret_cast<uint2*>(out + c * kChunk) = *reinterpret_cast<const uint2*>(q);
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) {
    const float v = to_f32(x[i]);
    if constexpr (kAmax) m = max(m, fp8_rule::abs_bits(v));
    out[i] = to_fp8<F>(v * s);
  }
  if constexpr (kAmax) block_amax(m, scratch, amax_out);
}

// out[C,R] = x[R,C]^T through 32 x 32 tiles in shared memory (one padding byte per row keeps the
// column reads off a single bank... of 4-byte words: 33-byte rows spread them).
constexpr int kTile = 32, kRowsPerPass = 8;
__global__ void transpose_bytes_kernel(const std::uint8_t* __restrict__ x, std::uint8_t* __restrict__ out,
                                       std::int64_t R, std::int64_t C) {
  __shared__ std::uint8_t tile[kTile][kTile + 1];
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kTile, c0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  for (int dr = threadIdx.y; dr < kTile; dr += kRowsPerPass) {
    const std::int64_t r = r0 + dr, c = c0 + threadIdx.x;
    if (r < R && c < C) tile[dr][threadIdx.x] = x[r * C + c];
  }
  __syncthreads();
  for (int dc = threadIdx.y; dc < kTile; dc += kRowsPerPass) {
    const std::int64_t c = c0 + dc, r = r0 + threadIdx.x;
    if (r < R && c < C) out[c * R + r] = tile[threadIdx.x][dc];
  }
}

// One warp: the history's maximum (NaN skipped), then the scale rule.
__global__ void update_scale_kernel(const float* __restrict__ history, std::int64_t n, float fp8_max, int margin,
                                    float* __restrict__ scale, float* __restrict__ inv_scale) {
  float a = 0.f;
  for (std::int64_t i = threadIdx.x; i < n; i += 32) {
    const float h = history[i];
    if (h > a) a = h;   // NaN compares false: skipped
  }
  a = warp_max(a);   // no NaN left: fmaxf is an exact maximum
  if (threadIdx.x == 0 && fp8_rule::usable_amax(a)) {
    const int k = fp8_rule::scale_exponent(a, fp8_max, margin);
    *scale = fp8_rule::exp2i(k);
    *inv_scale = fp8_rule::exp2i(-k);
  }
}

template <class T, Fp8Format F>
void launch_cast(Resources& r, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out) {
  const std::int64_t n = x.numel();
  const bool aligned = is_aligned16(x.data()) && (reinterpret_cast<std::uintptr_t>(out.data()) & 7u) == 0;
  const std::int64_t chunks = aligned ? n / kChunk : 0;
  const unsigned blocks = grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms);
  const T* xp = x.data_as<const T>();
  auto* op = out.data_as<std::uint8_t>();
  const float* sp = scale.data_as<const float>();
  if (amax_out) {
    cast_fp8_kernel<T, F, true><<<blocks, kThreads, 0, r.stream>>>(xp, sp, op, n, chunks,
                                                                    amax_out->data_as<std::uint32_t>());
  } else {
    cast_fp8_kernel<T, F, false><<<blocks, kThreads, 0, r.stream>>>(xp, sp, op, n, chunks, nullptr);
  }
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void amax(Context& ctx, const Tensor& x, Tensor& out) {
  Resources& r = resources(ctx);
  LMSCALE_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, 4, r.stream));
  const std::int64_t n = x.numel();
  if (n == 0) return;
  const unsigned blocks = grid_for(n, kThreads, r.num_sms);
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "amax", T,
                              amax_kernel<T><<<blocks, kThreads, 0, r.stream>>>(x.data_as<const T>(), n,
                                                                                out.data_as<std::uint32_t>()));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void cast_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out) {
  Resources& r = resources(ctx);
  if (amax_out) LMSCALE_CUDA_CHECK(cudaMemsetAsync(amax_out->data(), 0, 4, r.stream));
  if (x.numel() == 0) return;
  const bool e4m3 = out.dtype() == DType::e4m3;
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "cast_fp8", T,
                              e4m3 ? launch_cast<T, Fp8Format::e4m3>(r, x, scale, out, amax_out)
                                   : launch_cast<T, Fp8Format::e5m2>(r, x, scale, out, amax_out));
}

void transpose_fp8(Context& ctx, const Tensor& x, Tensor& out) {
  Resources& r = resources(ctx);
  const std::int64_t R = x.dim(0), C = x.dim(1);
  LMSCALE_CHECK((C + kTile - 1) / kTile < (1LL << 31) && (R + kTile - 1) / kTile < 65536,
                "transpose_fp8: {} x {} is beyond one launch's grid", R, C);
  const dim3 grid(static_cast<unsigned>((C + kTile - 1) / kTile), static_cast<unsigned>((R + kTile - 1) / kTile));
  transpose_bytes_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, r.stream>>>(x.data_as<const std::uint8_t>(),
                                                                           out.data_as<std::uint8_t>(), R, C);
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void fp8_update_scale(Context& ctx, const Tensor& amax_history, Fp8Format format, int margin, Tensor& scale,
                      Tensor& inv_scale) {
  Resources& r = resources(ctx);
  update_scale_kernel<<<1, 32, 0, r.stream>>>(amax_history.data_as<const float>(), amax_history.numel(),
                                              fp8_max(format), margin, scale.data_as<float>(),
                                              inv_scale.data_as<float>());
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
