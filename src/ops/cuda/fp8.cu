// amax, cast_fp8, cast_transpose_fp8, transpose_fp8, gather_scalars, fp8_update_scale and the
// fused fp8_amax_update_scale on CUDA (lmscale/ops/fp8.h). The scalar rules are ops/fp8_scale_rule.h's, shared with the CPU
// reference; the conversion is the hardware's
// cvt.rn.satfinite (__nv_cvt_float_to_fp8 with __NV_SATFINITE, sm_89+), which the gpu tests hold
// against core/fp8.h bit for bit.
#include "cast_transpose.cuh"
#include "cuda_ops.h"
#include "fp8_device.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {
namespace {

using namespace fp8_device;

constexpr int kThreads = 256;

template <class T>
__global__ void amax_kernel(const T* __restrict__ x, std::int64_t n, std::uint32_t* __restrict__ out) {
  __shared__ std::uint32_t scratch[32];
  std::uint32_t m = 0;
  for (std::int64_t i = thread_index(), step = thread_stride(); i < n; i += step)
    m = max(m, fp8_rule::abs_bits(to_f32(x[i])));
  block_amax(m, scratch, out);
}

// Current scaling's amax pass with the scale update at its end (ops::fp8_amax_update_scale).
// Chunks of 8 elements where x is 16-byte aligned; the rest one by one.
template <class T>
__global__ void amax_update_scale_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t chunks,
                                         HistoryArgs h, float* __restrict__ scale) {
  __shared__ std::uint32_t scratch[32];
  std::uint32_t m = 0;
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < chunks; c += step) {
    float v[kChunk];
    load_chunk(x + c * kChunk, v);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) m = max(m, fp8_rule::abs_bits(v[e]));
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) m = max(m, fp8_rule::abs_bits(to_f32(x[i])));
  finish_amax<true>(m, scratch, h, scale);
}

// out[i] = fp8(fp32(x[i]) * scale). Chunks of 8 elements (16-byte loads of x, one 8-byte store)
// where x is 16-byte and out 8-byte aligned; the rest one by one. kAmax: max |x| into
// *amax_out (zeroed before the launch). kDerive: the scale from the history first (delayed
// scaling, derive_scale); kRecord: max |x| into the history's record slot (finish_amax).
template <class T, Fp8Format F, bool kAmax, bool kDerive, bool kRecord>
__global__ void cast_fp8_kernel(const T* __restrict__ x, float* __restrict__ scale, std::uint8_t* __restrict__ out,
                                std::int64_t n, std::int64_t chunks, std::uint32_t* __restrict__ amax_out,
                                HistoryArgs h) {
  __shared__ std::uint32_t scratch[32];
  __shared__ float shared_scale;
  float s;
  if constexpr (kDerive) s = derive_scale(h, scale, &shared_scale);
  else s = *scale;
  std::uint32_t m = 0;
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < chunks; c += step) {
    float v[kChunk];
    load_chunk(x + c * kChunk, v);
    alignas(8) std::uint8_t q[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      if constexpr (kAmax || kRecord) m = max(m, fp8_rule::abs_bits(v[e]));
      q[e] = to_fp8<F>(v[e] * s);
    }
    *reinterpret_cast<uint2*>(out + c * kChunk) = *reinterpret_cast<const uint2*>(q);
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) {
    const float v = to_f32(x[i]);
    if constexpr (kAmax || kRecord) m = max(m, fp8_rule::abs_bits(v));
    out[i] = to_fp8<F>(v * s);
  }
  if constexpr (kAmax) block_amax(m, scratch, amax_out);
  if constexpr (kRecord) finish_amax<false>(m, scratch, h, scale);
}

// The fused cast and transpose (ops::cast_transpose_fp8): one 64 x 64 tile of x [M,K] per block
// of 16 x 16 threads. Each thread casts 4 consecutive elements of a row in each of 4 passes (a
// warp reads 2 rows of 64 elements: whole lines), writes them to out as one 4-byte word where
// aligned and keeps them in the shared tile; after a barrier it gathers 4 consecutive tile rows
// of one column and writes them as one word of out_t's row (again 64 contiguous bytes per row of
// 16 threads). Tile rows are 68 bytes (17 words) so the column reads of a warp spread over the
// banks (2-way conflicts at most). Edges (M or K not multiples of 64 or 4, unaligned rows) go
// byte by byte. kDerive, kRecord as in cast_fp8_kernel.
constexpr int kCtTile = 64, kCtThreads = 16, kCtPasses = kCtTile / kCtThreads;
template <class T, Fp8Format F, bool kDerive, bool kRecord>
__global__ void __launch_bounds__(kCtThreads* kCtThreads)
    cast_transpose_kernel(const T* __restrict__ x, std::int64_t M, std::int64_t K, float* __restrict__ scale,
                          std::uint8_t* __restrict__ out, std::uint8_t* __restrict__ out_t, bool vec_x,
                          bool vec_out, bool vec_out_t, HistoryArgs h) {
  __shared__ __align__(16) std::uint8_t tile[kCtTile][kCtTile + 4];
  __shared__ std::uint32_t scratch[32];
  __shared__ float shared_scale;
  float s;
  if constexpr (kDerive) s = derive_scale(h, scale, &shared_scale);
  else s = *scale;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kCtTile,
                     c0 = static_cast<std::int64_t>(blockIdx.x) * kCtTile;
  std::uint32_t m = 0;
#pragma unroll
  for (int p = 0; p < kCtPasses; ++p) {
    const int tr = ty + p * kCtThreads, tc = 4 * tx;
    const std::int64_t r = r0 + tr, c = c0 + tc;
    alignas(4) std::uint8_t q[4] = {0, 0, 0, 0};
    if (r < M) {
      const T* row = x + r * K;
      float v[4];
      const bool full = c + 3 < K;
      if (full && vec_x) {
        struct alignas(4 * sizeof(T)) Four {
          T e[4];
        };
        const Four f = *reinterpret_cast<const Four*>(row + c);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = to_f32(f.e[e]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = c + e < K ? to_f32(row[c + e]) : 0.f;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kRecord) m = max(m, fp8_rule::abs_bits(v[e]));   // 0 past the edge: no effect
        q[e] = to_fp8<F>(v[e] * s);
      }
      if (out) {
        if (full && vec_out) {
          *reinterpret_cast<std::uint32_t*>(out + r * K + c) = *reinterpret_cast<const std::uint32_t*>(q);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (c + e < K) out[r * K + c + e] = q[e];
        }
      }
    }
    *reinterpret_cast<std::uint32_t*>(&tile[tr][tc]) = *reinterpret_cast<const std::uint32_t*>(q);
  }
  __syncthreads();
#pragma unroll
  for (int p = 0; p < kCtPasses; ++p) {
    const int tc = ty + p * kCtThreads, tr = 4 * tx;   // out_t row c0 + tc, columns r0 + tr ...
    const std::int64_t c = c0 + tc, r = r0 + tr;
    if (c >= K) continue;
    alignas(4) std::uint8_t q[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = tile[tr + e][tc];
    std::uint8_t* row = out_t + c * M;
    if (r + 3 < M && vec_out_t) {
      *reinterpret_cast<std::uint32_t*>(row + r) = *reinterpret_cast<const std::uint32_t*>(q);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (r + e < M) row[r + e] = q[e];
    }
  }
  if constexpr (kRecord) finish_amax<false>(m, scratch, h, scale);
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

// ops::gather_scalars: thread i copies source i (the pointers travel in the launch's arguments).
struct GatherSources {
  const float* p[kMaxGathered];
  int n;
};
__global__ void gather_scalars_kernel(GatherSources src, float* __restrict__ out, std::int64_t stride) {
  const int i = threadIdx.x;
  if (i < src.n) out[stride * i] = *src.p[i];
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
void launch_cast(Resources& r, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out,
                 const Fp8HistoryUpdate* update) {
  const std::int64_t n = x.numel();
  const bool aligned = is_aligned16(x.data()) && (reinterpret_cast<std::uintptr_t>(out.data()) & 7u) == 0;
  const std::int64_t chunks = aligned ? n / kChunk : 0;
  const unsigned blocks = grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms);
  const T* xp = x.data_as<const T>();
  auto* op = out.data_as<std::uint8_t>();
  auto* sp = scale.data_as<float>();
  const HistoryArgs h = update ? history_args(*update) : HistoryArgs{};
  if (update && update->record_slot >= 0) {
    cast_fp8_kernel<T, F, false, true, true><<<blocks, kThreads, 0, r.stream>>>(xp, sp, op, n, chunks, nullptr, h);
  } else if (update) {
    cast_fp8_kernel<T, F, false, true, false><<<blocks, kThreads, 0, r.stream>>>(xp, sp, op, n, chunks, nullptr, h);
  } else if (amax_out) {
    cast_fp8_kernel<T, F, true, false, false><<<blocks, kThreads, 0, r.stream>>>(
        xp, sp, op, n, chunks, amax_out->data_as<std::uint32_t>(), h);
  } else {
    cast_fp8_kernel<T, F, false, false, false><<<blocks, kThreads, 0, r.stream>>>(xp, sp, op, n, chunks, nullptr, h);
  }
  LMSCALE_CUDA_CHECK_LAUNCH();
}

template <class T, Fp8Format F>
void launch_cast_transpose(Resources& r, const Tensor& x, const Tensor& scale, Tensor* out, Tensor& out_t,
                           const Fp8HistoryUpdate* update) {
  const std::int64_t M = x.dim(0), K = x.dim(1);
  const auto tiles = [](std::int64_t n) { return (n + kCtTile - 1) / kCtTile; };
  LMSCALE_CHECK(tiles(M) < 65536 && tiles(K) < (1LL << 31), "cast_transpose_fp8: {} x {} is beyond one launch's grid",
                M, K);
  const auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  // Whole 4-element groups of a row are aligned when the row length and the base are.
  const bool vec_x = K % 4 == 0 && addr(x.data()) % (4 * sizeof(T)) == 0;
  const bool vec_out = out && K % 4 == 0 && addr(out->data()) % 4 == 0;
  const bool vec_out_t = M % 4 == 0 && addr(out_t.data()) % 4 == 0;
  const dim3 grid(static_cast<unsigned>(tiles(K)), static_cast<unsigned>(tiles(M))), block(kCtThreads, kCtThreads);
  const T* xp = x.data_as<const T>();
  auto* sp = scale.data_as<float>();
  auto* op = out ? out->data_as<std::uint8_t>() : nullptr;
  auto* tp = out_t.data_as<std::uint8_t>();
  const HistoryArgs h = update ? history_args(*update) : HistoryArgs{};
  // Whole 8-element groups everywhere: the 8-wide kernel (its own tiles and grid).
  if (cast_transpose8_fits(M, K, op, tp) && addr(x.data()) % 16 == 0) {
    launch_cast_transpose8<RowsSource<T>, F>(RowsSource<T>{xp, K}, M, K, sp, op, tp, update, r.stream);
    LMSCALE_CUDA_CHECK_LAUNCH();
    return;
  }
  if (update && update->record_slot >= 0) {
    cast_transpose_kernel<T, F, true, true>
        <<<grid, block, 0, r.stream>>>(xp, M, K, sp, op, tp, vec_x, vec_out, vec_out_t, h);
  } else if (update) {
    cast_transpose_kernel<T, F, true, false>
        <<<grid, block, 0, r.stream>>>(xp, M, K, sp, op, tp, vec_x, vec_out, vec_out_t, h);
  } else {
    cast_transpose_kernel<T, F, false, false>
        <<<grid, block, 0, r.stream>>>(xp, M, K, sp, op, tp, vec_x, vec_out, vec_out_t, h);
  }
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cast_transpose_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor* out, Tensor& out_t,
                        const Fp8HistoryUpdate* update) {
  if (x.numel() == 0) {   // no tile: the flat kernel's one block still updates and records
    if (!update) return;
    Tensor empty = out ? *out : out_t;
    return cuda::cast_fp8(ctx, x, scale, empty, nullptr, update);
  }
  Resources& r = resources(ctx);
  const bool e4m3 = out_t.dtype() == DType::e4m3;
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "cast_transpose_fp8", T,
                              e4m3 ? launch_cast_transpose<T, Fp8Format::e4m3>(r, x, scale, out, out_t, update)
                                   : launch_cast_transpose<T, Fp8Format::e5m2>(r, x, scale, out, out_t, update));
}

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

void cast_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out,
              const Fp8HistoryUpdate* update) {
  Resources& r = resources(ctx);
  if (amax_out) LMSCALE_CUDA_CHECK(cudaMemsetAsync(amax_out->data(), 0, 4, r.stream));
  if (x.numel() == 0 && !update) return;   // with an update, one block still updates and records
  const bool e4m3 = out.dtype() == DType::e4m3;
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "cast_fp8", T,
                              e4m3 ? launch_cast<T, Fp8Format::e4m3>(r, x, scale, out, amax_out, update)
                                   : launch_cast<T, Fp8Format::e5m2>(r, x, scale, out, amax_out, update));
}

void fp8_amax_update_scale(Context& ctx, const Tensor& x, Tensor& amax_history, std::int64_t slot, Fp8Format format,
                           int margin, Tensor& scale, Tensor& inv_scale, Tensor& work) {
  Resources& r = resources(ctx);
  const HistoryArgs h = history_args(Fp8HistoryUpdate{amax_history, slot, format, margin, inv_scale, work});
  const std::int64_t n = x.numel();
  const std::int64_t chunks = is_aligned16(x.data()) ? n / kChunk : 0;
  const unsigned blocks = grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms);
  LMSCALE_CUDA_DISPATCH_FLOAT(x.dtype(), "fp8_amax_update_scale", T,
                              amax_update_scale_kernel<T><<<blocks, kThreads, 0, r.stream>>>(
                                  x.data_as<const T>(), n, chunks, h, scale.data_as<float>()));
  LMSCALE_CUDA_CHECK_LAUNCH();
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

void gather_scalars(Context& ctx, std::initializer_list<const Tensor*> sources, Tensor& out, std::int64_t stride) {
  Resources& r = resources(ctx);
  GatherSources src{};
  for (const Tensor* t : sources) src.p[src.n++] = t->data_as<const float>();
  gather_scalars_kernel<<<1, 32, 0, r.stream>>>(src, out.data_as<float>(), stride);
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
