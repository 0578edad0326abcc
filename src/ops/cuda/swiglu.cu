// SwiGLU on CUDA: h = silu(a) * b and its backward, elementwise in fp32, 8 elements per thread and
// step with 16-byte accesses when the pointers allow (scalar path for the rest). a and b may be
// column blocks of wider rows (the model's a|b [N, 2F]; ops::swiglu_rows).
#include "amax_reduce.cuh"
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"
#include "swiglu_math.cuh"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;

// a, b (da, db) are [rows, cols] blocks of rows ld elements apart; h (dh) are contiguous [rows, cols].
// A chunk is 8 elements of one row: chunk c covers row c / cpr, columns 8 (c % cpr) on; the tail
// columns [8 cpr, cols) of every row go element by element.
struct Rows {
  std::int64_t rows, cols, ld, cpr;   // cpr: chunks per row (0: no vector path)
  __device__ std::int64_t tail() const { return cols - cpr * kChunk; }
};

// amax (null: none): max abs_bits of the stored outputs, accumulated per thread, then per block
// (block_amax; zeroed by the host before the launch).
template <class T>
__global__ void swiglu_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ h, Rows g,
                              std::uint32_t* __restrict__ amax) {
  __shared__ std::uint32_t amax_scratch[32];
  std::uint32_t m = 0;
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < g.rows * g.cpr; c += step) {
    const std::int64_t r = c / g.cpr, col = (c % g.cpr) * kChunk;
    float x[kChunk], y[kChunk];
    load_chunk(a + r * g.ld + col, x);
    load_chunk(b + r * g.ld + col, y);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      x[e] = swiglu_value(x[e], y[e]);
      m = max(m, stored_abs_bits<T>(x[e]));
    }
    store_chunk(h + r * g.cols + col, x);
  }
  const std::int64_t tail = g.tail();
  for (std::int64_t i = i0; i < g.rows * tail; i += step) {
    const std::int64_t r = i / tail, col = g.cpr * kChunk + i % tail;
    const float x = to_f32(a[r * g.ld + col]);
    const T out = from_f32<T>(swiglu_value(x, to_f32(b[r * g.ld + col])));
    h[r * g.cols + col] = out;
    m = max(m, fp8_rule::abs_bits(to_f32(out)));
  }
  if (amax) block_amax(m, amax_scratch, amax);
}

template <class T>
__global__ void swiglu_backward_kernel(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ dh,
                                       T* __restrict__ da, T* __restrict__ db, Rows g,
                                       std::uint32_t* __restrict__ amax) {
  __shared__ std::uint32_t amax_scratch[32];
  std::uint32_t m = 0;   // over da and db together
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < g.rows * g.cpr; c += step) {
    const std::int64_t r = c / g.cpr, col = (c % g.cpr) * kChunk, o = r * g.ld + col;
    float x[kChunk], y[kChunk], gr[kChunk], gx[kChunk], gy[kChunk];
    load_chunk(a + o, x);
    load_chunk(b + o, y);
    load_chunk(dh + r * g.cols + col, gr);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      swiglu_grad(x[e], y[e], gr[e], gx[e], gy[e]);
      m = max(m, max(stored_abs_bits<T>(gx[e]), stored_abs_bits<T>(gy[e])));
    }
    store_chunk(da + o, gx);
    store_chunk(db + o, gy);
  }
  const std::int64_t tail = g.tail();
  for (std::int64_t i = i0; i < g.rows * tail; i += step) {
    const std::int64_t r = i / tail, col = g.cpr * kChunk + i % tail, o = r * g.ld + col;
    float gx, gy;
    swiglu_grad(to_f32(a[o]), to_f32(b[o]), to_f32(dh[r * g.cols + col]), gx, gy);
    const T ox = from_f32<T>(gx), oy = from_f32<T>(gy);
    da[o] = ox;
    db[o] = oy;
    m = max(m, max(fp8_rule::abs_bits(to_f32(ox)), fp8_rule::abs_bits(to_f32(oy))));
  }
  if (amax) block_amax(m, amax_scratch, amax);
}

// Contiguous blocks (ld == cols) are one long row. The vector path needs every pointer 16-byte
// aligned and, with several rows, cols and ld multiples of 8 elements (so every row starts aligned).
Rows plan(std::int64_t rows, std::int64_t cols, std::int64_t ld, bool aligned) {
  if (ld == cols) {
    cols *= rows;
    ld = cols;
    rows = 1;
  }
  const bool vec = aligned && (rows == 1 || (cols % kChunk == 0 && ld % kChunk == 0));
  return {rows, cols, ld, vec ? cols / kChunk : 0};
}

unsigned grid_of(const Rows& g, int num_sms) {
  const std::int64_t work = std::max<std::int64_t>(g.rows * g.cpr, g.rows * (g.cols - g.cpr * kChunk));
  return grid_for(work, kThreads, num_sms);
}

}  // namespace

void swiglu(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols, std::int64_t ld,
            Tensor& h, Tensor* h_amax) {
  Resources& r = resources(ctx);
  std::uint32_t* amax = zeroed_amax(r.stream, h_amax);
  if (rows == 0 || cols == 0) return;
  const Rows g = plan(rows, cols, ld, is_aligned16(a.data()) && is_aligned16(b.data()) && is_aligned16(h.data()));
  LMSCALE_CUDA_DISPATCH_FLOAT(a.dtype(), "swiglu", T,
                              swiglu_kernel<T><<<grid_of(g, r.num_sms), kThreads, 0, r.stream>>>(
                                  a.data_as<const T>(), b.data_as<const T>(), h.data_as<T>(), g, amax));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                     std::int64_t ld, const Tensor& dh, Tensor& da, Tensor& db, Tensor* dab_amax) {
  Resources& r = resources(ctx);
  std::uint32_t* amax = zeroed_amax(r.stream, dab_amax);
  if (rows == 0 || cols == 0) return;
  const bool aligned = is_aligned16(a.data()) && is_aligned16(b.data()) && is_aligned16(dh.data()) &&
                       is_aligned16(da.data()) && is_aligned16(db.data());
  const Rows g = plan(rows, cols, ld, aligned);
  LMSCALE_CUDA_DISPATCH_FLOAT(a.dtype(), "swiglu_backward", T,
                              swiglu_backward_kernel<T><<<grid_of(g, r.num_sms), kThreads, 0, r.stream>>>(
                                  a.data_as<const T>(), b.data_as<const T>(), dh.data_as<const T>(), da.data_as<T>(),
                                  db.data_as<T>(), g, amax));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
