// RMSNorm on CUDA, fp32 inside (docs/architecture.md §2): y = x * rstd * w, rstd = rsqrt(mean(x^2) + eps).
// x, y, dy, dx share a dtype T (fp32, bf16, fp16); the weight w and its gradient dw may be fp32 or
// T (fp32 master weights with bf16 activations). One block per row in the forward; the backward
// runs a fixed grid of blocks over rows, each keeping its dw partial sums in shared memory, and a
// second launch adds the per-block partials in a fixed order: deterministic, no float atomics.
// An optional amax output (lmscale/ops/ops.h) takes the maximum abs_bits of the stored y or dx,
// per thread, then per block by an integer atomicMax (amax_reduce.cuh): exact, any order.
#include <algorithm>

#include "amax_reduce.cuh"
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

// Threads per row: enough for one chunk of 8 each up to 256 threads, at least one warp.
int row_threads(std::int64_t d) {
  const std::int64_t chunks = (d + kChunk - 1) / kChunk;
  const std::int64_t t = (chunks + 31) / 32 * 32;
  return static_cast<int>(std::max<std::int64_t>(32, std::min<std::int64_t>(256, t)));
}

// out += the chunk at p (the residual gradient a backward adds into), in fp32.
template <class T>
__device__ __forceinline__ void add_existing(const T* p, float (&out)[kChunk]) {
  float prev[kChunk];
  load_chunk(p, prev);
#pragma unroll
  for (int e = 0; e < kChunk; ++e) out[e] += prev[e];
}

// The second pass of a forward row: rstd = rsqrt(ss / d + eps) from this thread's part ss of the
// row's sum of squares, then y = src * rstd * w (src: the row just read, or the sum just written,
// by this block: the second read hits L1/L2), the largest |y| stored into y_amax when given. src
// is not __restrict__: the sum was written in this kernel, so its reads must not take the
// read-only (non-coherent) path.
template <bool kVec, class T, class W>
__device__ __forceinline__ void normalize_row(const T* src, const W* __restrict__ w, T* __restrict__ yr,
                                              float ss, int d, float eps, float* __restrict__ rstd,
                                              std::uint32_t* __restrict__ y_amax) {
  __shared__ float scratch[32];
  __shared__ std::uint32_t amax_scratch[32];
  std::uint32_t m = 0;   // max abs_bits of the y this thread stores (used when y_amax is given)
  const float r = rsqrtf(block_sum(ss, scratch) / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) *rstd = r;
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < d; c += blockDim.x * kChunk) {
      float v[kChunk], g[kChunk];
      load_chunk(src + c, v);
      load_chunk(w + c, g);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[e] = v[e] * r * g[e];
      store_chunk_amax(yr + c, v, m);
    }
  } else {
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const T out = from_f32<T>(to_f32(src[c]) * r * to_f32(w[c]));
      yr[c] = out;
      m = max(m, fp8_rule::abs_bits(to_f32(out)));
    }
  }
  if (y_amax) block_amax(m, amax_scratch, y_amax);
}

// sum = a + b rounded to T (ops::add), then rmsnorm of the rounded sum (ops::rmsnorm): one block
// per row, each thread reading back in the second pass the chunks it wrote in the first.
template <bool kVec, class T, class W>
__global__ void add_rmsnorm_kernel(const T* __restrict__ a, const T* __restrict__ b, const W* __restrict__ w,
                                   T* __restrict__ sum, T* __restrict__ y, float* __restrict__ rstd, int d, float eps,
                                   std::uint32_t* __restrict__ y_amax) {
  const std::int64_t row = blockIdx.x;
  const T *ar = a + row * d, *br = b + row * d;
  T *sr = sum + row * d, *yr = y + row * d;
  float ss = 0.f;
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < d; c += blockDim.x * kChunk) {
      float u[kChunk], v[kChunk];
      load_chunk(ar + c, u);
      load_chunk(br + c, v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        u[e] = to_f32(from_f32<T>(u[e] + v[e]));   // the value ops::add stores
        ss = fmaf(u[e], u[e], ss);
      }
      store_chunk(sr + c, u);
    }
  } else {
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const T s = from_f32<T>(to_f32(ar[c]) + to_f32(br[c]));
      sr[c] = s;
      const float v = to_f32(s);
      ss = fmaf(v, v, ss);
    }
  }
  normalize_row<kVec>(sr, w, yr, ss, d, eps, rstd + row, y_amax);
}

template <bool kVec, class T, class W>
__global__ void rmsnorm_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                               float* __restrict__ rstd, int d, float eps, std::uint32_t* __restrict__ y_amax) {
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  float ss = 0.f;
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < d; c += blockDim.x * kChunk) {
      float v[kChunk];
      load_chunk(xr + c, v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) ss = fmaf(v[e], v[e], ss);
    }
  } else {
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const float v = to_f32(xr[c]);
      ss = fmaf(v, v, ss);
    }
  }
  normalize_row<kVec>(xr, w, yr, ss, d, eps, rstd + row, y_amax);
}

// dx = rstd * (dy*w) - x * rstd^3 * mean(dy*w*x);  dw_partial[block] += dy * x * rstd over the
// block's rows. Shared memory: d floats of dw partials, each column owned by one thread.
template <bool kVec, class T, class W>
__global__ void rmsnorm_backward_kernel(const T* __restrict__ x, const W* __restrict__ w,
                                        const float* __restrict__ rstd, const T* __restrict__ dy,
                                        T* __restrict__ dx, float* __restrict__ dw_partial, std::int64_t rows,
                                        int d, bool accumulate, std::uint32_t* __restrict__ dx_amax) {
  extern __shared__ float dw_acc[];
  __shared__ float scratch[32];
  __shared__ std::uint32_t amax_scratch[32];
  std::uint32_t m = 0;   // max abs_bits of the dx this thread stores (used when dx_amax is given)
  for (int c = threadIdx.x; c < d; c += blockDim.x) dw_acc[c] = 0.f;
  __syncthreads();
  const float inv_d = 1.f / static_cast<float>(d);
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * d;
    const T* dyr = dy + row * d;
    T* dxr = dx + row * d;
    const float r = rstd[row];
    float dot = 0.f;
    if constexpr (kVec) {
      for (int c = threadIdx.x * kChunk; c < d; c += blockDim.x * kChunk) {
        float xv[kChunk], gv[kChunk], wv[kChunk];
        load_chunk(xr + c, xv);
        load_chunk(dyr + c, gv);
        load_chunk(w + c, wv);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) dot = fmaf(gv[e] * wv[e], xv[e], dot);
      }
    } else {
      for (int c = threadIdx.x; c < d; c += blockDim.x) dot = fmaf(to_f32(dyr[c]) * to_f32(w[c]), to_f32(xr[c]), dot);
    }
    const float k = block_sum(dot, scratch) * inv_d * r * r * r;
    if constexpr (kVec) {
      for (int c = threadIdx.x * kChunk; c < d; c += blockDim.x * kChunk) {
        float xv[kChunk], gv[kChunk], wv[kChunk], out[kChunk];
        load_chunk(xr + c, xv);
        load_chunk(dyr + c, gv);
        load_chunk(w + c, wv);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          out[e] = r * gv[e] * wv[e] - xv[e] * k;
          dw_acc[c + e] = fmaf(gv[e] * xv[e], r, dw_acc[c + e]);
        }
        if (accumulate) add_existing(dxr + c, out);
        store_chunk_amax(dxr + c, out, m);
      }
    } else {
      for (int c = threadIdx.x; c < d; c += blockDim.x) {
        const float xv = to_f32(xr[c]), gv = to_f32(dyr[c]);
        const T out = from_f32<T>(r * gv * to_f32(w[c]) - xv * k + (accumulate ? to_f32(dxr[c]) : 0.f));
        dxr[c] = out;
        m = max(m, fp8_rule::abs_bits(to_f32(out)));
        dw_acc[c] = fmaf(gv * xv, r, dw_acc[c]);
      }
    }
  }
  if (dx_amax) block_amax(m, amax_scratch, dx_amax);
  __syncthreads();
  float* out = dw_partial + static_cast<std::int64_t>(blockIdx.x) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) out[c] = dw_acc[c];
}

// block_sum of two values at once (one pair of __syncthreads for both); each is added in the
// order block_sum adds it. scratch: 32 float2.
__device__ __forceinline__ float2 block_sum2(float2 x, float2* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x.x = warp_sum(x.x);
  x.y = warp_sum(x.y);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : make_float2(0.f, 0.f);
  x.x = warp_sum(x.x);
  x.y = warp_sum(x.y);
  __syncthreads();
  return x;
}

// The same for rows of at most kRC * blockDim.x * 8 elements (kRC = 1 up to d = 2048, 2 up to
// 4096 at 256 threads: every preset): each thread keeps its chunks of the row in registers between
// the two passes and its dw partial sums in registers, so a row is read from memory once. Two rows
// (row and row + gridDim.x) per iteration share one reduction: twice the loads in flight per block
// (xl, d 1600, 2048 rows: 17.5 us per call with one row, 1.7 TB/s). Each row's dot product, dx and
// dw partial add up in the same order as one row at a time.
template <int kRC, class T, class W>
__global__ void rmsnorm_backward_regs_kernel(const T* __restrict__ x, const W* __restrict__ w,
                                             const float* __restrict__ rstd, const T* __restrict__ dy,
                                             T* __restrict__ dx, float* __restrict__ dw_partial, std::int64_t rows,
                                             int d, bool accumulate, std::uint32_t* __restrict__ dx_amax) {
  __shared__ float2 scratch[32];
  __shared__ std::uint32_t amax_scratch[32];
  std::uint32_t m = 0;   // max abs_bits of the dx this thread stores (used when dx_amax is given)
  const float inv_d = 1.f / static_cast<float>(d);
  float wv[kRC][kChunk], acc[kRC][kChunk];
#pragma unroll
  for (int j = 0; j < kRC; ++j) {
    const int c = (threadIdx.x + j * blockDim.x) * kChunk;
    if (c < d) load_chunk(w + c, wv[j]);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) acc[j][e] = 0.f;
  }
  const std::int64_t step = gridDim.x;
  for (std::int64_t row0 = blockIdx.x; row0 < rows; row0 += 2 * step) {
    const std::int64_t row_of[2] = {row0, row0 + step};
    const bool has1 = row0 + step < rows;
    float xv[2][kRC][kChunk], gv[2][kRC][kChunk];
    float dot[2] = {0.f, 0.f};
    // Both rows' loads first, then the dot products: no row's loads wait behind the other's FMAs.
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (q == 1 && !has1) break;
#pragma unroll
      for (int j = 0; j < kRC; ++j) {
        const int c = (threadIdx.x + j * blockDim.x) * kChunk;
        if (c < d) {
          load_chunk(x + row_of[q] * d + c, xv[q][j]);
          load_chunk(dy + row_of[q] * d + c, gv[q][j]);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (q == 1 && !has1) break;
#pragma unroll
      for (int j = 0; j < kRC; ++j) {
        const int c = (threadIdx.x + j * blockDim.x) * kChunk;
        if (c < d)
#pragma unroll
          for (int e = 0; e < kChunk; ++e) dot[q] = fmaf(gv[q][j][e] * wv[j][e], xv[q][j][e], dot[q]);
      }
    }
    const float2 sums = block_sum2(make_float2(dot[0], dot[1]), scratch);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (q == 1 && !has1) break;
      const std::int64_t row = row_of[q];
      const float r = rstd[row];
      const float k = (q == 0 ? sums.x : sums.y) * inv_d * r * r * r;
#pragma unroll
      for (int j = 0; j < kRC; ++j) {
        const int c = (threadIdx.x + j * blockDim.x) * kChunk;
        if (c < d) {
          float out[kChunk];
#pragma unroll
          for (int e = 0; e < kChunk; ++e) {
            out[e] = r * gv[q][j][e] * wv[j][e] - xv[q][j][e] * k;
            acc[j][e] = fmaf(gv[q][j][e] * xv[q][j][e], r, acc[j][e]);
          }
          if (accumulate) add_existing(dx + row * d + c, out);
          store_chunk_amax(dx + row * d + c, out, m);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRC; ++j) {
    const int c = (threadIdx.x + j * blockDim.x) * kChunk;
    if (c < d)
#pragma unroll
      for (int e = 0; e < kChunk; ++e) dw_partial[static_cast<std::int64_t>(blockIdx.x) * d + c + e] = acc[j][e];
  }
  if (dx_amax) block_amax(m, amax_scratch, dx_amax);
}

// dw[c] += sum over blocks b of dw_partial[b, c], in a fixed order: a block of 32 x 32 threads
// covers 32 columns; thread row y adds partial rows y, y+32, ...; then row 0 adds the 32 sums in
// order. (32 x 8 threads, 50 blocks for xl's d = 1600, took 6.5 us per call: too few loads in flight.)
constexpr int kDwCols = 32, kDwRows = 32;
template <class W>
__global__ void rmsnorm_dw_kernel(const float* __restrict__ dw_partial, int blocks, int d, W* __restrict__ dw) {
  __shared__ float part[kDwRows][kDwCols + 1];
  const int c = blockIdx.x * kDwCols + threadIdx.x;
  float acc = 0.f;
  if (c < d)
    for (int b = threadIdx.y; b < blocks; b += kDwRows) acc += dw_partial[static_cast<std::int64_t>(b) * d + c];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kDwRows; ++y) total += part[y][threadIdx.x];
    dw[c] = from_f32<W>(to_f32(dw[c]) + total);
  }
}

// Runs `body` with W bound to the weight's element type: fp32 or the activations' T.
template <class T, class F>
void with_weight_type(DType wt, DType xt, const char* op, F&& body) {
  if (wt == DType::f32) body(float{});
  else if (wt == xt) body(T{});
  else throw Error(fmt::format("{}: weight is {} with {} activations (fp32 or the same dtype)", op, dtype_name(wt),
                               dtype_name(xt)));
}

}  // namespace

void rmsnorm(Context& ctx, const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd, Tensor* y_amax) {
  const std::int64_t d = x.dim(-1), rows = d ? x.numel() / d : 0;
  LMSCALE_CHECK(y.dtype() == x.dtype() && rstd.dtype() == DType::f32, "rmsnorm: y {} / rstd {} with x {}",
                dtype_name(y.dtype()), dtype_name(rstd.dtype()), dtype_name(x.dtype()));
  Resources& r = resources(ctx);
  std::uint32_t* amax = zeroed_amax(r.stream, y_amax);
  if (rows == 0) return;
  const bool vec = d % kChunk == 0 && is_aligned16(x.data()) && is_aligned16(y.data()) && is_aligned16(w.data());
  const int threads = row_threads(d);
  LMSCALE_CHECK(rows <= 0x7fffffff, "rmsnorm: {} rows", rows);
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "rmsnorm", T, {
    with_weight_type<T>(w.dtype(), x.dtype(), "rmsnorm", [&](auto wtag) {
      using W = decltype(wtag);
      auto kernel = vec ? rmsnorm_kernel<true, T, W> : rmsnorm_kernel<false, T, W>;
      kernel<<<static_cast<unsigned>(rows), threads, 0, r.stream>>>(x.data_as<const T>(), w.data_as<const W>(),
                                                                   y.data_as<T>(), rstd.data_as<float>(),
                                                                   static_cast<int>(d), static_cast<float>(eps), amax);
    });
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void add_rmsnorm(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& w, double eps, Tensor& sum, Tensor& y,
                 Tensor& rstd, Tensor* y_amax) {
  const std::int64_t d = a.dim(-1), rows = d ? a.numel() / d : 0;
  LMSCALE_CHECK(b.dtype() == a.dtype() && sum.dtype() == a.dtype() && y.dtype() == a.dtype() &&
                    rstd.dtype() == DType::f32,
                "add_rmsnorm: b {}, sum {}, y {}, rstd {} with a {}", dtype_name(b.dtype()), dtype_name(sum.dtype()),
                dtype_name(y.dtype()), dtype_name(rstd.dtype()), dtype_name(a.dtype()));
  Resources& r = resources(ctx);
  std::uint32_t* amax = zeroed_amax(r.stream, y_amax);
  if (rows == 0) return;
  const bool vec = d % kChunk == 0 && is_aligned16(a.data()) && is_aligned16(b.data()) && is_aligned16(sum.data()) &&
                   is_aligned16(y.data()) && is_aligned16(w.data());
  LMSCALE_CHECK(rows <= 0x7fffffff, "add_rmsnorm: {} rows", rows);
  LMSCALE_CUDA_DISPATCH_FLOAT(a.dtype(), "add_rmsnorm", T, {
    with_weight_type<T>(w.dtype(), a.dtype(), "add_rmsnorm", [&](auto wtag) {
      using W = decltype(wtag);
      auto kernel = vec ? add_rmsnorm_kernel<true, T, W> : add_rmsnorm_kernel<false, T, W>;
      kernel<<<static_cast<unsigned>(rows), row_threads(d), 0, r.stream>>>(
          a.data_as<const T>(), b.data_as<const T>(), w.data_as<const W>(), sum.data_as<T>(), y.data_as<T>(),
          rstd.data_as<float>(), static_cast<int>(d), static_cast<float>(eps), amax);
    });
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor& dw, bool accumulate_dx, Tensor* dx_amax) {
  const std::int64_t d = x.dim(-1), rows = d ? x.numel() / d : 0;
  LMSCALE_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && rstd.dtype() == DType::f32,
                "rmsnorm_backward: dy {}, dx {}, rstd {} with x {}", dtype_name(dy.dtype()), dtype_name(dx.dtype()),
                dtype_name(rstd.dtype()), dtype_name(x.dtype()));
  LMSCALE_CHECK(dw.dtype() == w.dtype(), "rmsnorm_backward: dw is {} but w is {}", dtype_name(dw.dtype()),
                dtype_name(w.dtype()));
  Resources& r = resources(ctx);
  std::uint32_t* amax = zeroed_amax(r.stream, dx_amax);
  if (rows == 0) return;
  const bool vec = d % kChunk == 0 && is_aligned16(x.data()) && is_aligned16(dy.data()) &&
                   is_aligned16(dx.data()) && is_aligned16(w.data());
  const int threads = row_threads(d);
  // At most four blocks per multiprocessor (as many as fit at once for the register kernel: one
  // wave), each adding up its rows' dw: enough warps in flight to hide the row loads, and partials
  // few enough ([blocks, d] fp32) for one cheap pass.
  const std::int64_t per_pass = static_cast<std::int64_t>(threads) * kChunk;   // elements per chunk column
  const bool regs = vec && d <= 2 * per_pass;
  int per_sm = 4;
  if (regs) {
    LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "rmsnorm_backward", T, {
      with_weight_type<T>(w.dtype(), x.dtype(), "rmsnorm_backward", [&](auto wtag) {
        using W = decltype(wtag);
        auto kernel = d <= per_pass ? rmsnorm_backward_regs_kernel<1, T, W> : rmsnorm_backward_regs_kernel<2, T, W>;
        LMSCALE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
      });
    });
    per_sm = std::clamp(per_sm, 1, 4);
  }
  const int blocks = static_cast<int>(std::min<std::int64_t>(rows, per_sm * r.num_sms));
  const std::size_t smem = static_cast<std::size_t>(d) * sizeof(float);
  Scratch partial(ctx, static_cast<std::size_t>(blocks) * smem, "rmsnorm_dw_partials");
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "rmsnorm_backward", T, {
    with_weight_type<T>(w.dtype(), x.dtype(), "rmsnorm_backward", [&](auto wtag) {
      using W = decltype(wtag);
      if (regs) {
        auto kernel = d <= per_pass ? rmsnorm_backward_regs_kernel<1, T, W> : rmsnorm_backward_regs_kernel<2, T, W>;
        kernel<<<blocks, threads, 0, r.stream>>>(x.data_as<const T>(), w.data_as<const W>(),
                                                 rstd.data_as<const float>(), dy.data_as<const T>(), dx.data_as<T>(),
                                                 partial.as<float>(), rows, static_cast<int>(d), accumulate_dx,
                                                 amax);
      } else {
        auto kernel = vec ? rmsnorm_backward_kernel<true, T, W> : rmsnorm_backward_kernel<false, T, W>;
        if (smem > 48 * 1024)
          LMSCALE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(smem)));
        kernel<<<blocks, threads, smem, r.stream>>>(x.data_as<const T>(), w.data_as<const W>(),
                                                    rstd.data_as<const float>(), dy.data_as<const T>(),
                                                    dx.data_as<T>(), partial.as<float>(), rows, static_cast<int>(d),
                                                    accumulate_dx, amax);
      }
      LMSCALE_CUDA_CHECK_LAUNCH();
      rmsnorm_dw_kernel<W><<<static_cast<unsigned>((d + kDwCols - 1) / kDwCols), dim3(kDwCols, kDwRows), 0, r.stream>>>(
          partial.as<const float>(), blocks, static_cast<int>(d), dw.data_as<W>());
    });
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
