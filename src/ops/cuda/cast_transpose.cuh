#pragma once
// The 8-wide FP8 cast and transpose over tiles of 64 columns (ops::cast_transpose_fp8, fp8.cu), written
// once for every source of the values cast: a tensor in memory (RowsSource), or a producer that
// computes them and never stores them in the compute dtype (fp8_producers.cu: SwiGLU and its
// backward; docs/precision.md, "Casts fused into the producers").
//
// A source covers an [M, K] grid and yields kOut values per grid element: output tile t holds
// columns [t K, (t + 1) K) of out [M, kOut K] (and rows of out_t [kOut K, M]). So SwiGLU's backward
// reads a, b and dh once for da (columns [0, K)) and db (columns [K, 2K)).
//
// Where M and K are multiples of 8 and the source (16 bytes) and out, out_t (8 bytes) are aligned,
// whole 8-element groups are in or out of the matrix, so there is no byte path. One tile of
// Src::kTileRows x 64 (rows x columns) per block of 256 threads: a thread loads 8 consecutive
// elements of a row in each of kTileRows / 32 passes (8 threads a row, 32 rows a pass), writes
// their 8 codes to out as one 8-byte word and into the shared tile; after a barrier it gathers 8
// consecutive tile rows of one column and writes them as one 8-byte word of out_t's row. Tile rows
// are 68 bytes (17 words): the column reads of a warp fall on at most 2 words of one bank. Every
// code is the one cast_fp8 gives the same value and scale, and the amax is over the values cast,
// so the result is bitwise the flat cast's whatever the source. kDerive: the scale from the
// history first (delayed scaling, derive_scale); kRecord: the amax into the history's record slot.
//
// The tile and load order per source, from A/B runs of one xl fp8 step (delayed scaling, one
// H200, 2026-11-28; 64 x 64 tiles with each pass loading after the scale was the one shape
// before; kernel times by ncu from the intermediate variant's profile): a tensor in memory 128
// rows, every load first (the FFN forward's 144 casts of tensors 2.857 -> 2.793 ms); SwiGLU 64
// rows, loads first (1.671 -> 1.575 ms); SwiGLU's backward 64 rows in the old order (loads first:
// 2.216 -> 2.456 ms). All three on 128 rows with loads first made the step 1.3 ms slower (ptxas:
// 90-100 registers a thread for the SwiGLU sources). These casts run at about 2.25 TB/s of the
// H200's 4.8; what holds them there was not found (docs/precision.md, "Where the xl fp8 step goes").
#include "fp8_device.cuh"

namespace lmscale::ops::cuda {

// x [M, K] in memory, rows `ld` elements apart.
template <class T>
struct RowsSource {
  static constexpr int kOut = 1;
  static constexpr int kTileRows = 128;   // the tile's rows (64 or 128) and the load order: see above
  static constexpr bool kLoadsFirst = true;
  const T* x;
  std::int64_t ld;
  __device__ __forceinline__ void load(std::int64_t r, std::int64_t c, float (&v)[1][kChunk]) const {
    load_chunk(x + r * ld + c, v[0]);
  }
};

constexpr int kCt8Cols = 64, kCt8Threads = 256, kCt8Groups = kCt8Cols / 8,
              kCt8RowsPerPass = kCt8Threads / kCt8Groups;
// The transposed writes: 8 threads cover 64 tile rows (one 8-row group each), so a warp reads
// 4 columns of one 64-row block of the tile; kRows / 64 such blocks x 2 column sets of 32.
constexpr int kCt8RowBlock = 8 * kCt8Groups, kCt8ColsPerPass = kCt8Threads / kCt8Groups;
static_assert(kCt8Cols == 2 * kCt8ColsPerPass);

template <class Src, Fp8Format F, bool kDerive, bool kRecord>
__global__ void __launch_bounds__(kCt8Threads)
    cast_transpose8_kernel(const Src src, std::int64_t M, std::int64_t K, float* __restrict__ scale,
                           std::uint8_t* __restrict__ out, std::uint8_t* __restrict__ out_t, fp8_device::HistoryArgs h) {
  using namespace fp8_device;
  constexpr int kOut = Src::kOut, kRows = Src::kTileRows, kPasses = kRows / kCt8RowsPerPass;
  static_assert(kRows % kCt8RowBlock == 0);
  __shared__ __align__(16) std::uint8_t tile[kOut][kRows][kCt8Cols + 4];
  __shared__ std::uint32_t scratch[32];
  __shared__ float shared_scale;
  const std::int64_t Ko = kOut * K;   // out's row length
  const int group = threadIdx.x % kCt8Groups, lane_row = threadIdx.x / kCt8Groups;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kRows,
                     c0 = static_cast<std::int64_t>(blockIdx.x) * kCt8Cols;
  const std::int64_t c = c0 + 8 * group;
  // Src::kLoadsFirst: every pass's load issued before the scale is read and the first value cast;
  // otherwise (the old order) each pass loads, casts and stores in turn after the scale.
  constexpr bool kFirst = Src::kLoadsFirst;
  float v[kFirst ? kPasses : 1][kOut][kChunk];
  if constexpr (kFirst) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const std::int64_t r = r0 + lane_row + p * kCt8RowsPerPass;
      if (r < M && c < K) src.load(r, c, v[p]);
    }
  }
  float s;
  if constexpr (kDerive) s = derive_scale(h, scale, &shared_scale);
  else s = *scale;
  std::uint32_t m = 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int tr = lane_row + p * kCt8RowsPerPass, tc = 8 * group;
    const std::int64_t r = r0 + tr;
    auto& vp = v[kFirst ? p : 0];
    if (!kFirst && r < M && c < K) src.load(r, c, vp);
    alignas(8) std::uint8_t q[kOut][8] = {};
    if (r < M && c < K) {
#pragma unroll
      for (int t = 0; t < kOut; ++t) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if constexpr (kRecord) m = max(m, fp8_rule::abs_bits(vp[t][e]));
          q[t][e] = to_fp8<F>(vp[t][e] * s);
        }
        if (out) *reinterpret_cast<uint2*>(out + r * Ko + t * K + c) = *reinterpret_cast<const uint2*>(q[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < kOut; ++t) {
      auto* dst = reinterpret_cast<std::uint32_t*>(&tile[t][tr][tc]);
      dst[0] = reinterpret_cast<const std::uint32_t*>(q[t])[0];
      dst[1] = reinterpret_cast<const std::uint32_t*>(q[t])[1];
    }
  }
  __syncthreads();
  const int lane_col = threadIdx.x / kCt8Groups;
#pragma unroll
  for (int t = 0; t < kOut; ++t) {
#pragma unroll
    for (int rb = 0; rb < kRows / kCt8RowBlock; ++rb) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        // out_t row t K + c0 + tc, columns r0 + tr ... r0 + tr + 7
        const int tc = lane_col + p * kCt8ColsPerPass, tr = rb * kCt8RowBlock + 8 * group;
        const std::int64_t cc = c0 + tc, r = r0 + tr;
        if (cc >= K || r >= M) continue;
        alignas(8) std::uint8_t q[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) q[e] = tile[t][tr + e][tc];
        *reinterpret_cast<uint2*>(out_t + (t * K + cc) * M + r) = *reinterpret_cast<const uint2*>(q);
      }
    }
  }
  if constexpr (kRecord) finish_amax<false>(m, scratch, h, scale);
}

// Whether the 8-wide kernel takes an [M, K] grid with these outputs (the source's own
// alignment is its caller's to check).
inline bool cast_transpose8_fits(std::int64_t M, std::int64_t K, const void* out, const void* out_t) {
  const auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  return fp8_cast_kernel_shape(M, K) && (!out || addr(out) % 8 == 0) && addr(out_t) % 8 == 0 &&
         // kCt8RowBlock: the fewest rows a source's tile has (the kernel asserts kTileRows % 64 == 0)
         (K + kCt8Cols - 1) / kCt8Cols < (1LL << 31) && (M + kCt8RowBlock - 1) / kCt8RowBlock < 65536;
}

// Launches the kernel for `src` over [M, K] (M, K > 0, cast_transpose8_fits) under `update`
// (null: the given scale, nothing recorded).
template <class Src, Fp8Format F>
void launch_cast_transpose8(const Src& src, std::int64_t M, std::int64_t K, float* scale, std::uint8_t* out,
                            std::uint8_t* out_t, const Fp8HistoryUpdate* update, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((K + kCt8Cols - 1) / kCt8Cols), static_cast<unsigned>((M + Src::kTileRows - 1) / Src::kTileRows));
  const fp8_device::HistoryArgs h = update ? fp8_device::history_args(*update) : fp8_device::HistoryArgs{};
  if (update && update->record_slot >= 0)
    cast_transpose8_kernel<Src, F, true, true><<<grid, kCt8Threads, 0, stream>>>(src, M, K, scale, out, out_t, h);
  else if (update)
    cast_transpose8_kernel<Src, F, true, false><<<grid, kCt8Threads, 0, stream>>>(src, M, K, scale, out, out_t, h);
  else
    cast_transpose8_kernel<Src, F, false, false><<<grid, kCt8Threads, 0, stream>>>(src, M, K, scale, out, out_t, h);
}

}  // namespace lmscale::ops::cuda
