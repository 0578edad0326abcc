// fill, add, scale, cast, copy on CUDA. Each is one grid-stride launch moving 8 elements per thread
// and step with 16-byte accesses when every pointer is 16-byte aligned; the last n % 8 elements
// (and every element of an unaligned tensor) take the scalar path of the same kernel.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Elements [0, vec_end) go in chunks of 8 through the vector path, the rest one by one.
struct Split {
  std::int64_t chunks, vec_end;
};
inline Split split(std::int64_t n, bool aligned) {
  const std::int64_t chunks = aligned ? n / kChunk : 0;
  return {chunks, chunks * kChunk};
}

template <class T>
__global__ void fill_kernel(T* __restrict__ x, std::int64_t n, Split s, T value) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  Vec<T> v;
#pragma unroll
  for (int e = 0; e < Vec<T>::kN; ++e) v.v[e] = value;
  for (std::int64_t c = i0; c < s.chunks; c += step)
#pragma unroll
    for (int j = 0; j < kChunk; j += Vec<T>::kN) store_vec(x + c * kChunk + j, v);
  for (std::int64_t i = s.vec_end + i0; i < n; i += step) x[i] = value;
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, std::int64_t n, Split s) {
  // No __restrict__: out may alias a or b (each element is read before it is written, by the
  // same thread).
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < s.chunks; c += step) {
    float x[kChunk], y[kChunk];
    load_chunk(a + c * kChunk, x);
    load_chunk(b + c * kChunk, y);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) x[e] += y[e];
    store_chunk(out + c * kChunk, x);
  }
  for (std::int64_t i = s.vec_end + i0; i < n; i += step) out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, std::int64_t n, Split s, float factor) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < s.chunks; c += step) {
    float v[kChunk];
    load_chunk(x + c * kChunk, v);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] *= factor;
    store_chunk(x + c * kChunk, v);
  }
  for (std::int64_t i = s.vec_end + i0; i < n; i += step) x[i] = from_f32<T>(to_f32(x[i]) * factor);
}

// Conversion between two different floating types. fp64 is allowed on either side (one rounding
// through fp32 for fp64 -> 16-bit, which rounds once more: the difference is below bf16/fp16 ulp).
template <class D, class S>
__device__ __forceinline__ D convert(S x) {
  if constexpr (std::is_same_v<D, double>) return static_cast<double>(to_f32(x));
  else if constexpr (std::is_same_v<S, double>) {
    if constexpr (std::is_same_v<D, float>) return static_cast<float>(x);
    else return from_f32<D>(static_cast<float>(x));
  } else return from_f32<D>(to_f32(x));
}
template <class D, class S>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ dst, std::int64_t n, Split s) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < s.chunks; c += step) {
    S in[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; j += Vec<S>::kN) {
      const Vec<S> v = load_vec(src + c * kChunk + j);
#pragma unroll
      for (int e = 0; e < Vec<S>::kN; ++e) in[j + e] = v.v[e];
    }
#pragma unroll
    for (int j = 0; j < kChunk; j += Vec<D>::kN) {
      Vec<D> v;
#pragma unroll
      for (int e = 0; e < Vec<D>::kN; ++e) v.v[e] = convert<D>(in[j + e]);
      store_vec(dst + c * kChunk + j, v);
    }
  }
  for (std::int64_t i = s.vec_end + i0; i < n; i += step) dst[i] = convert<D>(src[i]);
}

// `T` bound to the element type of a floating dtype, fp64 included (cast), or of any dtype a
// fill may see (floating types and int32, e.g. the check_finite flag).
#define DISPATCH_FLOATING(dtype, op_name, T, ...)                                             \
  do {                                                                                        \
    if ((dtype) == DType::f64) {                                                              \
      using T = double;                                                                       \
      __VA_ARGS__;                                                                            \
    } else {                                                                                  \
      LMSCALE_CUDA_DISPATCH_FLOAT(dtype, op_name, T, __VA_ARGS__);                            \
    }                                                                                         \
  } while (0)
#define DISPATCH_ANY(dtype, op_name, T, ...)                                                  \
  do {                                                                                        \
    if ((dtype) == DType::i32) {                                                              \
      using T = std::int32_t;                                                                 \
      __VA_ARGS__;                                                                            \
    } else {                                                                                  \
      DISPATCH_FLOATING(dtype, op_name, T, __VA_ARGS__);                                      \
    }                                                                                         \
  } while (0)

template <class T>
T host_value(double v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(static_cast<float>(v));
  else return static_cast<T>(v);
}

}  // namespace

void fill(Context& ctx, Tensor& x, double value) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  if (value == 0.0 && !std::signbit(value)) {   // +0 is all-zero bits in every dtype
    LMSCALE_CUDA_CHECK(cudaMemsetAsync(x.data(), 0, x.nbytes(), stream(ctx)));
    return;
  }
  const Split s = split(n, is_aligned16(x.data()));
  const unsigned grid = grid_for(std::max<std::int64_t>(s.chunks, n - s.vec_end), kThreads, r.num_sms);
  DISPATCH_ANY(x.dtype(), "fill", T, {
    fill_kernel<T><<<grid, kThreads, 0, stream(ctx)>>>(x.data_as<T>(), n, s, host_value<T>(value));
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out) {
  LMSCALE_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "add: dtypes {}, {}, {} differ",
                dtype_name(a.dtype()), dtype_name(b.dtype()), dtype_name(out.dtype()));
  const std::int64_t n = out.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  const Split s = split(n, is_aligned16(a.data()) && is_aligned16(b.data()) && is_aligned16(out.data()));
  const unsigned grid = grid_for(std::max<std::int64_t>(s.chunks, n - s.vec_end), kThreads, r.num_sms);
  LMSCALE_CUDA_DISPATCH_FLOAT(out.dtype(), "add", T,
                              add_kernel<T><<<grid, kThreads, 0, stream(ctx)>>>(a.data_as<const T>(), b.data_as<const T>(),
                                                                             out.data_as<T>(), n, s));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void scale(Context& ctx, Tensor& x, double factor) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  const Split s = split(n, is_aligned16(x.data()));
  const unsigned grid = grid_for(std::max<std::int64_t>(s.chunks, n - s.vec_end), kThreads, r.num_sms);
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "scale", T,
                              scale_kernel<T><<<grid, kThreads, 0, stream(ctx)>>>(x.data_as<T>(), n, s,
                                                                               static_cast<float>(factor)));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void cast(Context& ctx, const Tensor& src, Tensor& dst) {
  LMSCALE_CHECK(src.numel() == dst.numel(), "cast: {} elements into {}", src.numel(), dst.numel());
  if (src.dtype() == dst.dtype()) {
    copy(ctx, src, dst);
    return;
  }
  LMSCALE_CHECK(is_floating(src.dtype()) && is_floating(dst.dtype()), "cast: {} -> {} (floating dtypes only)",
                dtype_name(src.dtype()), dtype_name(dst.dtype()));
  const std::int64_t n = src.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  const Split s = split(n, is_aligned16(src.data()) && is_aligned16(dst.data()));
  const unsigned grid = grid_for(std::max<std::int64_t>(s.chunks, n - s.vec_end), kThreads, r.num_sms);
  DISPATCH_FLOATING(src.dtype(), "cast", S, {
    DISPATCH_FLOATING(dst.dtype(), "cast", D, {
      cast_kernel<D, S><<<grid, kThreads, 0, stream(ctx)>>>(src.data_as<const S>(), dst.data_as<D>(), n, s);
    });
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void copy(Context& ctx, const Tensor& src, Tensor& dst) {
  LMSCALE_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), "copy: {} {} into {} {}",
                dtype_name(src.dtype()), src.numel(), dtype_name(dst.dtype()), dst.numel());
  if (src.nbytes() == 0 || src.data() == dst.data()) return;
  Resources& r = resources(ctx);
  if (src.device() == Device::cpu && dst.device() == Device::cpu) {
    // Host to host: ordered after queued device work that may still write src.
    LMSCALE_CUDA_CHECK(cudaStreamSynchronize(stream(ctx)));
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  // cudaMemcpyDefault: the unified address space tells host from device pointers.
  LMSCALE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, stream(ctx)));
  // The caller reads host memory right after a copy into it (pinned memory would otherwise be
  // written later, asynchronously).
  if (dst.device() == Device::cpu) LMSCALE_CUDA_CHECK(cudaStreamSynchronize(stream(ctx)));
}

}  // namespace lmscale::ops::cuda
