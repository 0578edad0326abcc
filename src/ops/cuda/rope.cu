// RoPE on CUDA, in place on x [B, T, H, Dh] ((b, t) rows row_stride elements apart): pair (2i, 2i+1) of each head vector at position t
// rotates by t * theta^(-2i/Dh) (the negative angle for the backward). cos/sin come from a table
// [T, Dh/2] computed once in double (Resources::rope_table), so fp32 results at long positions
// are as exact as fp32 allows and the kernel does no transcendental math. 8 elements (4 pairs)
// per thread and step with 16-byte accesses when Dh % 8 == 0 and x is 16-byte aligned.
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void rotate(float& x0, float& x1, float2 cs, float sign) {
  const float s = sign * cs.y;
  const float r0 = x0 * cs.x - x1 * s;
  const float r1 = x0 * s + x1 * cs.x;
  x0 = r0;
  x1 = r1;
}

// Element e of the logical [B, T, H, Dh] tensor: position t = (e / (H*Dh)) % T, pair index
// i = (e % Dh) / 2, stored at (e / (H*Dh)) * row_stride + e % (H*Dh).
template <class T>
__global__ void rope_kernel(T* __restrict__ x, std::int64_t n, std::int64_t chunks, std::int64_t T_len,
                            std::int64_t HDh, std::int64_t Dh, std::int64_t row_stride,
                            const float2* __restrict__ table, float sign) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  const std::int64_t half = Dh / 2;
  for (std::int64_t c = i0; c < chunks; c += step) {
    const std::int64_t e = c * kChunk;
    const std::int64_t t = (e / HDh) % T_len;
    const float2* row = table + t * half + (e % Dh) / 2;   // 4 consecutive pairs: one chunk never crosses a head
    T* at = x + (e / HDh) * row_stride + e % HDh;
    float v[kChunk];
    load_chunk(at, v);
#pragma unroll
    for (int p = 0; p < kChunk / 2; ++p) rotate(v[2 * p], v[2 * p + 1], row[p], sign);
    store_chunk(at, v);
  }
  // Scalar path over pairs for what the chunks did not cover.
  const std::int64_t first_pair = chunks * kChunk / 2, pairs = n / 2;
  for (std::int64_t p = first_pair + i0; p < pairs; p += step) {
    const std::int64_t e = 2 * p;
    const std::int64_t t = (e / HDh) % T_len;
    T* at = x + (e / HDh) * row_stride + e % HDh;
    float x0 = to_f32(at[0]), x1 = to_f32(at[1]);
    rotate(x0, x1, table[t * half + (e % Dh) / 2], sign);
    at[0] = from_f32<T>(x0);
    at[1] = from_f32<T>(x1);
  }
}

}  // namespace

void rope(Context& ctx, Tensor& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, double theta,
          bool inverse, std::int64_t row_stride) {
  LMSCALE_CHECK(Dh % 2 == 0 && row_stride >= H * Dh, "rope: x {} is not [{}, {}, {}, {}] (row stride {}) with even Dh",
                shape_str(x.shape()), B, T, H, Dh, row_stride);
  const std::int64_t n = B * T * H * Dh;   // logical elements
  if (n == 0) return;
  Resources& r = resources(ctx);
  const RopeTable& table = r.rope_table(T, Dh, theta);
  // 16-byte chunks need every row to start aligned too: row_stride a multiple of 8 elements.
  const bool vec = Dh % kChunk == 0 && row_stride % kChunk == 0 && is_aligned16(x.data());
  const std::int64_t chunks = vec ? n / kChunk : 0;
  const unsigned grid = grid_for(std::max<std::int64_t>(chunks, (n - chunks * kChunk) / 2), kThreads, r.num_sms);
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "rope", Elem,
                              rope_kernel<Elem><<<grid, kThreads, 0, r.stream>>>(
                                  x.data_as<Elem>(), n, chunks, T, H * Dh, Dh, row_stride,
                                  static_cast<const float2*>(table.data), inverse ? -1.f : 1.f));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
