// AdamW with the FP8 GEMM weights cast in the same pass (ops::Fp8WeightCast; docs/precision.md,
// "Weights cast by the optimizer step"). One launch covers a range of the flat parameters as
// work items, each a run of blocks:
//   a weight [R, K]  blocks of kTilesPerBlock 64 x 64 tiles along a row of tiles. A tile's
//                    fp32 p, g, m, v are read as 64 rows of 256 bytes (8 threads of 8 elements
//                    per row, two passes of 32 rows, all loads issued first as in adamw.cu),
//                    updated, and p rounded to the compute dtype is cast with the weight's
//                    scale: q's rows written directly, qt's through the tile in shared memory
//                    (68-byte rows, as cast_transpose_kernel in fp8.cu). One atomicMax of the
//                    block's amax into the weight's pending amax.
//   a plain range    what lies between the weights (norm gains, embedding, head): adamw.cu's
//                    update with its working copy, kPlainChunks chunks per block.
// Bytes per weight element: 16 read + 12 written + 2 (q, qt), where the plain step writes a 2-byte
// working copy that every forward then reads (2) to write q and qt (2) again.
// The tables travel in the kernel's parameters (__grid_constant__, about 13 KB of the 32 KB
// Hopper takes); a range with more weights or gradient pieces than one table holds is split at
// weight boundaries into several launches.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "adamw_device.cuh"
#include "cuda_ops.h"
#include "fp8_device.cuh"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

using namespace adamw_device;

constexpr int kTile = 64;
constexpr int kTileRow = kTile + 4;         // shared tile row, bytes
constexpr int kTilesPerBlock = 4;
constexpr int kPlainChunks = kThreads * kUnroll * 4;   // 2048 chunks = 16384 elements per block
constexpr int kMaxCasts = 160, kMaxPlains = kMaxCasts + 1;

struct CastItem {
  std::int64_t first_chunk;   // the weight's first chunk in the launch's range
  int rows, cols;             // R, K: multiples of kTile
  std::uint8_t* q;            // [R, K]
  std::uint8_t* qt;           // [K, R]
  const float* scale;
  std::uint32_t* amax;        // the pending amax's bits
};
struct PlainItem {
  std::int64_t first_chunk, chunks;
};
struct Work {
  int casts = 0, plains = 0;
  // Blocks of item i (casts first, then plains) start at first_block[i]; first_block[items] = grid.
  int first_block[kMaxCasts + kMaxPlains + 1];
  CastItem cast[kMaxCasts];
  PlainItem plain[kMaxPlains];
};

// A grads table over nothing: the casts-only launch reads no gradient.
struct NoGrad {
  __device__ const float* chunk(std::int64_t) const { return nullptr; }
};

template <class Low>
__device__ __forceinline__ std::uint8_t weight_code(float p, float scale, std::uint32_t& amax) {
  const float w = to_f32(from_f32<Low>(p));   // the working copy's value, which the forward cast read
  amax = max(amax, fp8_rule::abs_bits(w));
  return fp8_device::to_fp8<Fp8Format::e4m3>(w * scale);
}

template <class Low, class Grads>
__device__ void cast_item(float* __restrict__ param, const Grads& grads, float* __restrict__ m, float* __restrict__ v,
                          const CastItem& it, int block, bool stepping, const AdamWScalars& s) {
  __shared__ __align__(16) std::uint8_t tile[kTile * kTileRow];
  __shared__ std::uint32_t scratch[32];
  const int t = threadIdx.x;
  const int tiles_c = it.cols / kTile, tiles = (it.rows / kTile) * tiles_c;
  const float scale = *it.scale;
  std::uint32_t amax = 0;
  const int row_in_pass = t / 8, col = (t % 8) * kChunk;   // 8 threads per tile row
  for (int k = 0; k < kTilesPerBlock; ++k) {
    const int tix = block * kTilesPerBlock + k;
    if (tix >= tiles) break;
    const std::int64_t r0 = static_cast<std::int64_t>(tix / tiles_c) * kTile, c0 = static_cast<std::int64_t>(tix % tiles_c) * kTile;
    float p[2][kChunk], g[2][kChunk], mm[2][kChunk], vv[2][kChunk];
    std::int64_t ch[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const std::int64_t r = r0 + row_in_pass + 32 * u;
      ch[u] = it.first_chunk + (r * it.cols + c0 + col) / kChunk;
      const std::int64_t o = ch[u] * kChunk;
      load_chunk(param + o, p[u]);
      if (stepping) {
        load_chunk(grads.chunk(ch[u]), g[u]);
        load_chunk(m + o, mm[u]);
        load_chunk(v + o, vv[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const std::int64_t o = ch[u] * kChunk;
      if (stepping) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) adamw_update(p[u][e], g[u][e], mm[u][e], vv[u][e], s);
        store_chunk(param + o, p[u]);
        store_chunk(m + o, mm[u]);
        store_chunk(v + o, vv[u]);
      }
      alignas(8) std::uint8_t q[kChunk];
#pragma unroll
      for (int e = 0; e < kChunk; ++e) q[e] = weight_code<Low>(p[u][e], scale, amax);
      const int tr = row_in_pass + 32 * u;
      *reinterpret_cast<uint2*>(it.q + (r0 + tr) * it.cols + c0 + col) = *reinterpret_cast<const uint2*>(q);
      std::uint32_t* tw = reinterpret_cast<std::uint32_t*>(tile + tr * kTileRow + col);
      tw[0] = reinterpret_cast<const std::uint32_t*>(q)[0];
      tw[1] = reinterpret_cast<const std::uint32_t*>(q)[1];
    }
    __syncthreads();
    // qt row c0 + tc holds tile column tc: 16 x 16 threads, 4 consecutive tile rows each.
    const int tx = t % 16, ty = t / 16;
#pragma unroll
    for (int pass = 0; pass < kTile / 16; ++pass) {
      const int tc = ty + 16 * pass, tr = 4 * tx;
      alignas(4) std::uint8_t q[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) q[e] = tile[(tr + e) * kTileRow + tc];
      *reinterpret_cast<std::uint32_t*>(it.qt + (c0 + tc) * it.rows + r0 + tr) = *reinterpret_cast<const std::uint32_t*>(q);
    }
    __syncthreads();   // the next tile overwrites the shared one
  }
  block_amax(amax, scratch, it.amax);
}

template <class Low, class Grads>
__device__ void plain_item(float* __restrict__ param, const Grads& grads, float* __restrict__ m, float* __restrict__ v,
                           Low* __restrict__ low, const PlainItem& it, int block, const AdamWScalars& s) {
  const std::int64_t begin = it.first_chunk + static_cast<std::int64_t>(block) * kPlainChunks;
  const std::int64_t end = min(begin + kPlainChunks, it.first_chunk + it.chunks);
  for (std::int64_t base = begin; base < end; base += static_cast<std::int64_t>(kThreads) * kUnroll) {
    float p[kUnroll][kChunk], g[kUnroll][kChunk], mm[kUnroll][kChunk], vv[kUnroll][kChunk];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t c = base + u * kThreads + threadIdx.x;
      if (c >= end) continue;
      const std::int64_t o = c * kChunk;
      load_chunk(param + o, p[u]);
      load_chunk(grads.chunk(c), g[u]);
      load_chunk(m + o, mm[u]);
      load_chunk(v + o, vv[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t c = base + u * kThreads + threadIdx.x;
      if (c >= end) continue;
      const std::int64_t o = c * kChunk;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) adamw_update(p[u][e], g[u][e], mm[u][e], vv[u][e], s);
      store_chunk(param + o, p[u]);
      store_chunk(m + o, mm[u]);
      store_chunk(v + o, vv[u]);
      store_chunk(low + o, p[u]);
    }
  }
}

// update = false: the casts alone (no gradients, no state; every item a weight).
template <class Low, class Grads>
__global__ void __launch_bounds__(kThreads)
    adamw_cast_kernel(float* __restrict__ param, const __grid_constant__ Grads grads, float* __restrict__ m,
                      float* __restrict__ v, Low* __restrict__ low, const __grid_constant__ Work work, AdamWScalars s,
                      DeviceStep dev, bool update) {
  // A captured step whose norm is not finite updates nothing but still casts the weights, as the
  // next forward's cast would have.
  const bool stepping = update && step_scalars(dev, s);
  const int b = blockIdx.x, items = work.casts + work.plains;
  int lo = 0, hi = items - 1;   // the last item whose blocks start at or before b
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (work.first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  if (lo < work.casts) cast_item<Low>(param, grads, m, v, work.cast[lo], b - work.first_block[lo], stepping, s);
  else if (stepping) plain_item<Low>(param, grads, m, v, low, work.plain[lo - work.casts], b - work.first_block[lo], s);
}

// The warp of cast i: commit its pending amax (commit), the scale from its history, the pending
// amax zeroed (ops::fp8_weight_casts_begin).
constexpr int kMaxBegin = 128;
struct BeginTable {
  int count;
  fp8_device::HistoryArgs h[kMaxBegin];
  float* scale[kMaxBegin];
  float* pending[kMaxBegin];
};
__global__ void casts_begin_kernel(const __grid_constant__ BeginTable table, bool commit) {
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  if (i >= table.count) return;
  const fp8_device::HistoryArgs& h = table.h[i];
  if (commit && lane == 0) {
    const int at = *h.slot;
    h.history[at] = *table.pending[i];
    *h.slot = static_cast<int>((at + 1) % h.n);
  }
  __syncwarp();
  float sc = 0.f, inv = 0.f;
  if (fp8_device::history_scale(h, sc, inv) && lane == 0) {
    *table.scale[i] = sc;
    *h.inv_scale = inv;
  }
  if (lane == 0) *table.pending[i] = 0.f;
}

// The gradient pieces overlapping [begin, end) (elements) as a table relative to begin.
GradPieces pieces_table(const std::vector<GradPiece>& pieces, std::int64_t begin, std::int64_t end) {
  GradPieces t{};
  for (const GradPiece& piece : pieces) {
    const std::int64_t p0 = piece.offset, p1 = piece.offset + piece.grad.numel();
    if (p1 <= begin || p0 >= end) continue;
    LMSCALE_CHECK(t.count < kMaxPieces, "adamw: more than {} gradient pieces in one launch", kMaxPieces);
    const std::int64_t from = std::max(p0, begin);
    t.first_chunk[t.count] = (from - begin) / kChunk;
    t.grad[t.count] = piece.grad.data_as<const float>() + (from - p0);
    ++t.count;
  }
  return t;
}
int pieces_in(const std::vector<GradPiece>& pieces, std::int64_t begin, std::int64_t end) {
  int n = 0;
  for (const GradPiece& piece : pieces)
    if (piece.offset < end && piece.offset + piece.grad.numel() > begin) ++n;
  return n;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The work of [begin, end) (elements) with casts [c0, c1) of `casts` (sorted, inside the range).
Work work_for(const std::vector<Fp8WeightCast>& casts, std::size_t c0, std::size_t c1, std::int64_t begin,
              std::int64_t end, bool plains) {
  Work w;
  int blocks = 0, item = 0;
  for (std::size_t i = c0; i < c1; ++i) {
    const Fp8WeightCast& c = casts[i];
    CastItem& it = w.cast[w.casts++];
    it.first_chunk = (c.offset - begin) / kChunk;
    it.rows = static_cast<int>(c.rows);
    it.cols = static_cast<int>(c.cols);
    it.q = static_cast<std::uint8_t*>(c.q.data());
    it.qt = static_cast<std::uint8_t*>(c.qt.data());
    it.scale = c.scale.data_as<const float>();
    it.amax = c.pending_amax.data_as<std::uint32_t>();
    w.first_block[item++] = blocks;
    blocks += static_cast<int>(ceil_div((c.rows / kTile) * (c.cols / kTile), kTilesPerBlock));
  }
  if (plains) {
    std::int64_t at = begin;
    auto gap = [&](std::int64_t to) {
      if (to <= at) return;
      PlainItem& p = w.plain[w.plains++];
      p.first_chunk = (at - begin) / kChunk;
      p.chunks = (to - at) / kChunk;
      w.first_block[item++] = blocks;
      blocks += static_cast<int>(ceil_div(p.chunks, kPlainChunks));
    };
    for (std::size_t i = c0; i < c1; ++i) {
      gap(casts[i].offset);
      at = casts[i].offset + casts[i].rows * casts[i].cols;
    }
    gap(end);
  }
  w.first_block[item] = blocks;
  return w;
}

template <class Low, class Grads>
void launch_work(Context& ctx, float* p, const Grads& grads, float* mp, float* vp, Low* low, const Work& w,
                 const AdamWScalars& s, const DeviceStep& dev, bool update) {
  const int blocks = w.first_block[w.casts + w.plains];
  if (blocks == 0) return;
  adamw_cast_kernel<Low, Grads><<<blocks, kThreads, 0, stream(ctx)>>>(p, grads, mp, vp, low, w, s, dev, update);
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void check_casts(const std::vector<Fp8WeightCast>& casts, std::int64_t n) {
  std::int64_t at = 0;
  for (const Fp8WeightCast& c : casts) {
    LMSCALE_CHECK(fp8_weight_cast_shape(c.rows, c.cols) && c.offset >= at && c.offset % kChunk == 0 &&
                      c.offset + c.rows * c.cols <= n && c.q.dtype() == DType::e4m3 && c.qt.dtype() == DType::e4m3 &&
                      c.q.numel() == c.rows * c.cols && c.qt.numel() == c.rows * c.cols &&
                      c.q.device() == Device::cuda && c.qt.device() == Device::cuda && is_aligned16(c.q.data()) &&
                      is_aligned16(c.qt.data()) && c.history.slot.defined(),
                  "adamw: an FP8 weight cast [{}, {}] at element {} does not fit (sorted, 64-multiples, 8-aligned, "
                  "e4m3 q and qt on the GPU, a device record slot)",
                  c.rows, c.cols, c.offset);
    at = c.offset + c.rows * c.cols;
  }
}

// Launches over [0, n) of p (and the tables relative to it), split at weight boundaries so each
// launch's weights and gradient pieces fit their tables.
template <class Low, class Grads, class MakeGrads>
void launch_all(Context& ctx, float* p, float* mp, float* vp, Low* low, std::int64_t n,
                const std::vector<Fp8WeightCast>& casts, const MakeGrads& make_grads,
                const std::vector<GradPiece>* pieces, const AdamWScalars& s, const DeviceStep& dev, bool update) {
  std::size_t c = 0;
  std::int64_t begin = 0;
  while (begin < n) {
    // Take weights while the launch's tables hold them and the gradient pieces up to their end.
    std::size_t c1 = c;
    while (c1 < casts.size() && c1 - c < static_cast<std::size_t>(kMaxCasts) &&
           (!pieces || pieces_in(*pieces, begin, casts[c1].offset + casts[c1].rows * casts[c1].cols) <= kMaxPieces))
      ++c1;
    // The next launch starts at the next weight; with none taken, this one ends there (what lies
    // before it), and a weight alone over too many pieces is refused.
    std::int64_t end = c1 < casts.size() ? casts[c1].offset : n;
    // Too many pieces up to there: end after the last weight taken (the gap goes to the next launch).
    if (pieces && c1 > c && pieces_in(*pieces, begin, end) > kMaxPieces)
      end = casts[c1 - 1].offset + casts[c1 - 1].rows * casts[c1 - 1].cols;
    LMSCALE_CHECK(end > begin, "adamw: one FP8 weight's gradients lie in more than {} pieces", kMaxPieces);
    LMSCALE_CHECK(!pieces || pieces_in(*pieces, begin, end) <= kMaxPieces,
                  "adamw: more than {} gradient pieces between two FP8 weights", kMaxPieces);
    const Work w = work_for(casts, c, c1, begin, end, update);
    launch_work<Low>(ctx, p + begin, make_grads(begin, end), mp ? mp + begin : nullptr, vp ? vp + begin : nullptr,
                     low ? low + begin : nullptr, w, s, dev, update);
    c = c1;
    begin = end;
  }
}

template <class Fn>
void with_low(DType rounding, Fn&& fn) {
  if (rounding == DType::bf16) fn(static_cast<__nv_bfloat16*>(nullptr));
  else if (rounding == DType::f16) fn(static_cast<__half*>(nullptr));
  else throw Error(fmt::format("adamw: FP8 weight casts round to bf16 or fp16, not {}", dtype_name(rounding)));
}

}  // namespace

static_assert(sizeof(Work) + sizeof(GradPieces) + 256 < 32000, "the kernel's parameters exceed what Hopper takes");

void adamw_fp8(Context& ctx, Tensor& param, const GradSource& grads, Tensor& m, Tensor& v, const AdamWStep& a,
               Tensor& param_lowp) {
  const std::int64_t n = param.numel();
  const std::vector<Fp8WeightCast>& casts = *a.fp8_casts;
  check_casts(casts, n);
  LMSCALE_CHECK(n % kChunk == 0 && param.dtype() == DType::f32 && m.dtype() == DType::f32 && v.dtype() == DType::f32 &&
                    is_aligned16(param.data()) && is_aligned16(m.data()) && is_aligned16(v.data()) &&
                    is_aligned16(param_lowp.data()) && param_lowp.numel() == n,
                "adamw: FP8 weight casts need fp32 16-byte aligned param, m, v of a multiple of 8 elements and their "
                "working copy");
  const AdamWScalars s = scalars(a);
  const DeviceStep dev = device_step(a);
  with_low(param_lowp.dtype(), [&](auto* tag) {
    using Low = std::remove_pointer_t<decltype(tag)>;
    Low* low = param_lowp.data_as<Low>();
    if (grads.pieces) {
      for (const GradPiece& piece : *grads.pieces)
        LMSCALE_CHECK(piece.offset % kChunk == 0 && piece.grad.numel() % kChunk == 0 &&
                          piece.grad.dtype() == DType::f32 && is_aligned16(piece.grad.data()),
                      "adamw: FP8 weight casts need gradient pieces of whole 8-element chunks, fp32, 16-byte aligned");
      launch_all<Low, GradPieces>(ctx, param.data_as<float>(), m.data_as<float>(), v.data_as<float>(), low, n, casts,
                                  [&](std::int64_t b, std::int64_t e) { return pieces_table(*grads.pieces, b, e); },
                                  grads.pieces, s, dev, true);
    } else {
      LMSCALE_CHECK(grads.one->dtype() == DType::f32 && is_aligned16(grads.one->data()),
                    "adamw: FP8 weight casts need fp32 16-byte aligned gradients");
      const float* g = grads.one->data_as<const float>();
      launch_all<Low, OneGrad>(ctx, param.data_as<float>(), m.data_as<float>(), v.data_as<float>(), low, n, casts,
                               [&](std::int64_t b, std::int64_t) { return OneGrad{g + b}; }, nullptr, s, dev, true);
    }
  });
}

void fp8_weight_casts(Context& ctx, const Tensor& param, DType rounding, const std::vector<Fp8WeightCast>& casts) {
  const std::int64_t n = param.numel();
  check_casts(casts, n);
  LMSCALE_CHECK(param.dtype() == DType::f32 && param.device() == Device::cuda && is_aligned16(param.data()),
                "fp8_weight_casts: param must be fp32, 16-byte aligned on the GPU");
  with_low(rounding, [&](auto* t) {
    using Low = std::remove_pointer_t<decltype(t)>;
    launch_all<Low, NoGrad>(ctx, const_cast<float*>(param.data_as<const float>()), nullptr, nullptr,
                            static_cast<Low*>(nullptr), n, casts, [](std::int64_t, std::int64_t) { return NoGrad{}; },
                            nullptr, AdamWScalars{}, DeviceStep{nullptr, nullptr}, false);
  });
}

void fp8_weight_casts_begin(Context& ctx, const std::vector<Fp8WeightCast>& casts, bool commit) {
  for (std::size_t first = 0; first < casts.size(); first += kMaxBegin) {
    BeginTable t{};
    t.count = static_cast<int>(std::min<std::size_t>(kMaxBegin, casts.size() - first));
    for (int i = 0; i < t.count; ++i) {
      const Fp8WeightCast& c = casts[first + static_cast<std::size_t>(i)];
      LMSCALE_CHECK(c.history.slot.defined() && c.scale.device() == Device::cuda,
                    "fp8_weight_casts_begin: a cast without its device record slot");
      t.h[i] = fp8_device::history_args(c.history);
      t.scale[i] = c.scale.data_as<float>();
      t.pending[i] = c.pending_amax.data_as<float>();
    }
    const int threads = 128;
    const int blocks = (t.count * 32 + threads - 1) / threads;
    casts_begin_kernel<<<blocks, threads, 0, stream(ctx)>>>(t, commit);
    LMSCALE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace lmscale::ops::cuda
