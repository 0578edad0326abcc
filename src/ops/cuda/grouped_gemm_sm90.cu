// The grouped GEMM kernel for Hopper (grouped_gemm_sm90.h): persistent, warp-specialised.
// - One CTA per SM, three warpgroups of 128 threads. Warpgroup 0 is the producer: one of its
//   threads walks the CTA's tiles and issues the TMA copies of each k step's A tile [128 x 64] and B tile
//   [256 x 64] into a 4-stage ring of shared memory, each stage guarded by a "full" mbarrier (the
//   copy engine completes it) and an "empty" one (the consumers release it). Warpgroups 1 and 2
//   are the consumers, rows [0, 64) and [64, 128) of the tile: per k step four m64n256k16 wgmma
//   from shared memory (K-major or M/N-major per the layout), one group in flight while the next
//   stage is awaited; then the fp32 accumulators go straight from registers to C.
// - The ring runs across tiles: the producer fills the next tile's stages while the consumers
//   finish a tile and store it.
// - Tiles are numbered product after product, m fastest (the CTAs of one wave share B's tiles,
//   the weights, in L2); CTA i takes tiles i, i + grid, ...
// Rows and columns past a matrix's end are zero-filled by the copy engine and never stored.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "grouped_gemm_sm90.h"
#include "hopper.cuh"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "wgmma_ops.cuh"

namespace lmscale::ops::cuda::grouped_sm90 {

using namespace lmscale::ops::cuda::sm90;

namespace {

constexpr int kThreads = 384;            // producer + 2 consumers
constexpr int kBlock = 64 * 64;          // elements of one 64 x 64 box (8 KiB in 16 bits)
constexpr int kStages = 4;
constexpr int kAcc = kTileN / 2;         // fp32 accumulators per consumer thread (64 x 256 per warpgroup)

template <class E>
struct Smem {
  alignas(1024) E a[kStages][kTileM * kTileK];   // K-major: [128 rows][64]; M-major: [2][64 k][64]
  alignas(1024) E b[kStages][kTileN * kTileK];   // K-major: [256 rows][64]; N-major: [4][64 k][64]
  alignas(8) std::uint64_t full[kStages];
  std::uint64_t empty[kStages];
};
template <class E>
constexpr int smem_bytes() {
  return static_cast<int>(sizeof(Smem<E>)) + 1024;   // + alignment slack of the dynamic buffer
}

// The product holding `tile` (problems are few: a linear walk).
__device__ __forceinline__ const DeviceProblem& problem_of(const LaunchParams& p, int tile) {
  int i = 0;
  while (i + 1 < p.problem_count && p.problems[i + 1].first_tile <= tile) ++i;
  return p.problems[i];
}

// Issues the TMA copies of one operand tile of one k step: `kRows` rows of the tile (m for A, n
// for B) from `mn0`, k from `k0`; `row` is the segment's first row of the operand and `matrix` its
// matrix in the stack. The bytes land on `bar`, whose expected count the caller set for the stage.
// - K-major (nt's A and B, nn's A): one box of [kRows][64 k], rows along the tile.
// - M/N-major (nn's B, tn's A and B): the operand's rows are k, so kRows / 64 boxes of [64 k][64],
//   one per 64 columns of the tile, kBlock elements apart (the layout desc_mn_major reads).
template <bool kMnMajor, int kRows, class E>
__device__ __forceinline__ void load_tile(E* dst, const CUtensorMap* map, std::uint64_t* bar, int mn0, int k0, int row,
                                          int matrix) {
  if constexpr (kMnMajor) {
#pragma unroll
    for (int cb = 0; cb < kRows / 64; ++cb) tma_load_3d(dst + cb * kBlock, map, bar, mn0 + cb * 64, row + k0, matrix);
  } else {
    tma_load_3d(dst, map, bar, k0, row + mn0, matrix);
  }
}

template <class T>
__device__ __forceinline__ void store_pair(T* at, float v0, float v1, bool accumulate) {
  if constexpr (std::is_same_v<T, float>) {
    float2 v = make_float2(v0, v1);
    if (accumulate) {
      const float2 old = *reinterpret_cast<const float2*>(at);
      v.x += old.x, v.y += old.y;
    }
    *reinterpret_cast<float2*>(at) = v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (accumulate) {
      const float2 old = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
      v0 += old.x, v1 += old.y;
    }
    *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(v0, v1);
  } else {
    if (accumulate) {
      const float2 old = __half22float2(*reinterpret_cast<const __half2*>(at));
      v0 += old.x, v1 += old.y;
    }
    *reinterpret_cast<__half2*>(at) = __floats2half2_rn(v0, v1);
  }
}

template <class E, class Out, bool kAMn, bool kBMn>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemm_kernel(const __grid_constant__ LaunchParams p) {
#ifdef LMSCALE_SM90_DEVICE
  constexpr bool kF16 = std::is_same_v<E, __half>;
  constexpr unsigned kStageBytes = (kTileM + kTileN) * kTileK * sizeof(E);
  extern __shared__ unsigned char smem_raw[];
  auto& s = *reinterpret_cast<Smem<E>*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t(1023));
  const int wg = static_cast<int>(threadIdx.x) / 128;
  const int tile0 = static_cast<int>(blockIdx.x), tile_step = static_cast<int>(gridDim.x);

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&s.full[i], 1);
      mbar_init(&s.empty[i], 8);   // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer: one thread drives the copy engine.
    regs_dealloc<24>();
    if (threadIdx.x == 0) {
      int it = 0;   // k steps issued so far: stage it % kStages, phase (it / kStages) & 1
      for (int tile = tile0; tile < p.tile_count; tile += tile_step) {
        const DeviceProblem& pr = problem_of(p, tile);
        const int local = tile - pr.first_tile, m0 = (local % pr.tiles_m) * kTileM, n0 = (local / pr.tiles_m) * kTileN;
        for (int si = 0; si < pr.segment_count; ++si) {
          const DeviceSegment& sg = pr.segments[si];
          const CUtensorMap* ma = &p.maps[sg.a_map];
          const CUtensorMap* mb = &p.maps[sg.b_map];
          for (int kt = 0; kt < sg.k_tiles; ++kt, ++it) {
            const int st = it % kStages;
            mbar_wait(&s.empty[st], ((it / kStages) & 1) ^ 1);
            mbar_arrive_expect_tx(&s.full[st], kStageBytes);
            const int k0 = kt * kTileK;
            load_tile<kAMn, kTileM>(s.a[st], ma, &s.full[st], m0, k0, sg.a_row, sg.a_matrix);
            load_tile<kBMn, kTileN>(s.b[st], mb, &s.full[st], n0, k0, sg.b_row, sg.b_matrix);
          }
        }
      }
    }
  } else {
    // ---- consumers: warpgroup c owns rows [64 c, 64 c + 64) of each tile.
    regs_alloc<240>();
    const int c = wg - 1;
    const int tid = static_cast<int>(threadIdx.x) - 128 * wg;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    // Releases a stage: one arrival per warp, after the warp's wait for the MMAs that read it (a
    // warpgroup's MMA completes as one).
    const auto release = [&](int st) {
      if (lane == 0) mbar_arrive(&s.empty[st]);
    };
    float acc[kAcc];
    int it = 0;
    for (int tile = tile0; tile < p.tile_count; tile += tile_step) {
      const DeviceProblem& pr = problem_of(p, tile);
      const int local = tile - pr.first_tile, m0 = (local % pr.tiles_m) * kTileM, n0 = (local / pr.tiles_m) * kTileN;
      int steps = 0;
      for (int si = 0; si < pr.segment_count; ++si) steps += pr.segments[si].k_tiles;
      int held = -1;   // the stage the MMAs in flight read
      for (int j = 0; j < steps; ++j, ++it) {
        const int st = it % kStages;
        mbar_wait(&s.full[st], (it / kStages) & 1);
        const std::uint32_t a0 = smem_u32(&s.a[st][0]), b0 = smem_u32(&s.b[st][0]);
        wgmma_fence();
        fence_regs(acc);
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          // M/N-major: a k16 step is 16 rows of 128 bytes (2048 bytes); column blocks 8 KiB apart.
          const std::uint64_t da = kAMn ? desc_mn_major(a0 + c * kBlock * 2 + kk * 2048, kBlock * 2)
                                        : desc_k_major(a0 + c * 64 * 128 + kk * 32);
          const std::uint64_t db = kBMn ? desc_mn_major(b0 + kk * 2048, kBlock * 2) : desc_k_major(b0 + kk * 32);
          wgmma_ss<kTileN, kF16, kAMn ? 1 : 0, kBMn ? 1 : 0>(acc, da, db, (j > 0 || kk > 0) ? 1 : 0);
        }
        wgmma_commit();
        fence_regs(acc);
        wgmma_wait<1>();   // the previous step's MMAs are done: release their stage
        fence_regs(acc);
        if (held >= 0) release(held);
        held = st;
      }
      wgmma_wait<0>();
      fence_regs(acc);
      if (held >= 0) release(held);
      if (steps == 0) {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
      }
      // acc[4j + {0,1}] = (row 16 warp + g, columns 8j + 2t + {0,1}), acc[4j + {2,3}] = row + 8.
      Out* C = static_cast<Out*>(pr.c);
      const bool accumulate = p.accumulate != 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = m0 + 64 * c + 16 * warp + g + 8 * r;
        if (row >= pr.m) continue;
        Out* crow = C + static_cast<long long>(row) * pr.ldc;
#pragma unroll
        for (int j = 0; j < kTileN / 8; ++j) {
          const int col = n0 + 8 * j + 2 * t;
          if (col < pr.n) store_pair(crow + col, acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1], accumulate);
        }
      }
    }
  }
#else
  (void)p;
#endif
}

template <class E, class Out, bool kAMn, bool kBMn>
void launch_kernel(const LaunchParams& p, int ctas, cudaStream_t stream) {
  auto* kernel = grouped_gemm_kernel<E, Out, kAMn, kBMn>;
  constexpr int bytes = smem_bytes<E>();
  // The attribute belongs to the kernel on the current device, and a process uses one device:
  // set it once per instantiation (a function-local static: initialised once, thread-safe; a
  // throw leaves it unset, so the next launch tries again).
  static const bool smem_set = [&] {
    LMSCALE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)smem_set;
  kernel<<<ctas, kThreads, bytes, stream>>>(p);
  LMSCALE_CUDA_CHECK(cudaGetLastError());
}

// fp32 C for tn only (the weight gradients into fp32 master gradients; supports() holds to it).
template <class E>
void launch_layout(const LaunchParams& p, Layout layout, bool f32_out, int ctas, cudaStream_t stream) {
  switch (layout) {
    case Layout::nt: return launch_kernel<E, E, false, false>(p, ctas, stream);
    case Layout::nn: return launch_kernel<E, E, false, true>(p, ctas, stream);
    case Layout::tn:
      return f32_out ? launch_kernel<E, float, true, true>(p, ctas, stream) : launch_kernel<E, E, true, true>(p, ctas, stream);
  }
}

}  // namespace

void launch(const LaunchParams& p, Layout layout, DType in, DType out, int ctas, cudaStream_t stream) {
  LMSCALE_CHECK(out == in || (out == DType::f32 && layout == Layout::tn),
                "grouped GEMM (sm90): {} output of {} inputs (the inputs' dtype, or fp32 for tn)", dtype_name(out),
                dtype_name(in));
  if (in == DType::bf16) return launch_layout<__nv_bfloat16>(p, layout, out == DType::f32, ctas, stream);
  if (in == DType::f16) return launch_layout<__half>(p, layout, out == DType::f32, ctas, stream);
  throw Error("grouped GEMM (sm90): bf16 or fp16 inputs only");
}

}  // namespace lmscale::ops::cuda::grouped_sm90
