// sum_squares (gradient norm) and check_finite (fp16 overflow detection) on CUDA.
// sum_squares is deterministic: a fixed grid (set by the device's multiprocessor count) writes
// one fp32 partial per block, and one block adds the partials in a fixed order. No float atomics.
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;   // the finishing block has this many threads

template <class T>
__global__ void sum_squares_partial_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t chunks,
                                           float* __restrict__ partials) {
  __shared__ float scratch[32];
  const std::int64_t i0 = thread_index(), step = thread_stride();
  // Two independent accumulators keep two chunks' loads in flight.
  float acc0 = 0.f, acc1 = 0.f;
  std::int64_t c = i0;
  for (; c + step < chunks; c += 2 * step) {
    float a[kChunk], b[kChunk];
    load_chunk(x + c * kChunk, a);
    load_chunk(x + (c + step) * kChunk, b);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      acc0 = fmaf(a[e], a[e], acc0);
      acc1 = fmaf(b[e], b[e], acc1);
    }
  }
  for (; c < chunks; c += step) {
    float a[kChunk];
    load_chunk(x + c * kChunk, a);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) acc0 = fmaf(a[e], a[e], acc0);
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) {
    const float v = to_f32(x[i]);
    acc0 = fmaf(v, v, acc0);
  }
  const float total = block_sum(acc0 + acc1, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_partials_kernel(const float* __restrict__ partials, int count, float* __restrict__ out) {
  __shared__ float scratch[32];
  const float v = threadIdx.x < count ? partials[threadIdx.x] : 0.f;
  const float total = block_sum(v, scratch);
  if (threadIdx.x == 0) *out = total;
}

template <class T>
__global__ void check_finite_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t chunks,
                                    int* __restrict__ flag) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  bool bad = false;
  for (std::int64_t c = i0; c < chunks; c += step) {
    float a[kChunk];
    load_chunk(x + c * kChunk, a);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) bad |= !isfinite(a[e]);
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) bad |= !isfinite(to_f32(x[i]));
  // Every writer stores the same value, so the race is benign and the result deterministic.
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

}  // namespace

void sum_squares(Context& ctx, const Tensor& x, Tensor& out) {
  LMSCALE_CHECK(out.dtype() == DType::f32 && out.numel() == 1, "sum_squares: out must be one fp32 element, is {} {}",
                dtype_name(out.dtype()), shape_str(out.shape()));
  Resources& r = resources(ctx);
  const std::int64_t n = x.numel();
  const std::int64_t chunks = is_aligned16(x.data()) ? n / kChunk : 0;
  const int blocks = static_cast<int>(
      std::min<unsigned>(grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms, 4),
                         kMaxPartials));
  Scratch partials(ctx, static_cast<std::size_t>(blocks) * sizeof(float), "sum_squares_partials");
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "sum_squares", T,
                              sum_squares_partial_kernel<T><<<blocks, kThreads, 0, r.stream>>>(
                                  x.data_as<const T>(), n, chunks, partials.as<float>()));
  LMSCALE_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kMaxPartials, 0, r.stream>>>(partials.as<float>(), blocks, out.data_as<float>());
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void check_finite(Context& ctx, const Tensor& x, Tensor& flag) {
  LMSCALE_CHECK(flag.dtype() == DType::i32 && flag.numel() == 1, "check_finite: flag must be one int32, is {} {}",
                dtype_name(flag.dtype()), shape_str(flag.shape()));
  const std::int64_t n = x.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  const std::int64_t chunks = is_aligned16(x.data()) ? n / kChunk : 0;
  const unsigned grid = grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms, 4);
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "check_finite", T,
                              check_finite_kernel<T><<<grid, kThreads, 0, r.stream>>>(x.data_as<const T>(), n, chunks,
                                                                                        flag.data_as<int>()));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
