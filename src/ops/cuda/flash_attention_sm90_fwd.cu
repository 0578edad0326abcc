// FlashAttention forward for Hopper (sm_90a), the FlashAttention-3 design (Shah et al. 2024):
// - one CTA per (128 query rows, batch*head): three warpgroups of 128 threads. Warpgroup 0 is the
//   producer: one thread issues TMA bulk tensor copies of the Q tile once and of K and V tiles
//   into a two-stage ring of shared-memory buffers, each guarded by a "full" mbarrier (the copy
//   engine completes it) and an "empty" one (the consumers release it). Warpgroups 1 and 2 are
//   consumers of 64 query rows each; the producer gives its registers to them (setmaxnreg).
// - S = Q K^T [64 x 128 keys] by wgmma with both operands in shared memory (K-major); P rounded
//   to the input dtype stays in registers as the A operand of O += P V (V M/N-major in shared
//   memory): the fp32 accumulator layout of wgmma equals the register A-fragment layout, so P
//   needs no shuffle.
// - Two overlaps per consumer: within a warpgroup, the softmax of tile j runs while the
//   tensor cores compute P_{j-1} V_{j-1} (issued just before); between warpgroups, named barriers
//   take turns ("ping-pong"), so one warpgroup issues its GEMMs while the other does its softmax.
// - Key tiles are visited from the last to the first: the tiles that need a mask (the causal
//   diagonal, the key tile crossing the sequence end) come first and are the only ones with index
//   compares; tiles past the diagonal are never loaded; causal CTAs with the most work start first.
// Rows past the sequence end are zero-filled by TMA and never stored. Softmax in log2 units;
// lse is the natural-log logsumexp of the scaled scores (the FA2 backward reads the same).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "attention_mma.cuh"
#include "flash_attention_sm90.h"
#include "hopper.cuh"
#include "wgmma_ops.cuh"

namespace lmscale::ops::cuda::attn::sm90_fwd {

using namespace lmscale::ops::cuda::sm90;

constexpr int kBM = 128;        // query rows per CTA (2 consumer warpgroups x 64)
constexpr int kBN = 128;        // keys per tile
constexpr int kStages = 2;      // K and V ring depth
constexpr int kThreads = 384;   // producer + 2 consumers
constexpr int kConsumerThreads = 256;

template <class E, int D>
struct Smem {
  static constexpr int kCB = D / 64;   // 64-element column blocks per row
  alignas(1024) E q[kCB][kBM][64];
  alignas(1024) E k[kStages][kCB][kBN][64];
  alignas(1024) E v[kStages][kCB][kBN][64];
  alignas(8) std::uint64_t q_full;
  std::uint64_t k_full[kStages], v_full[kStages], k_empty[kStages], v_empty[kStages];
};

template <class E, int D>
constexpr std::size_t smem_bytes() {
  return sizeof(Smem<E, D>) + 1024;   // + alignment slack of the dynamic buffer
}

template <class E, int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const Params p) {
#ifdef LMSCALE_SM90_DEVICE
  constexpr bool kF16 = std::is_same_v<E, __half>;
  constexpr int kCB = D / 64;
  constexpr int kTileBytes = kBN * D * static_cast<int>(sizeof(E));
  extern __shared__ unsigned char smem_raw[];
  auto& s = *reinterpret_cast<Smem<E, D>*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t(1023));

  const int num_m = (p.seq + kBM - 1) / kBM;
  // Causal: the CTAs of the last query tiles have the most key tiles; launch them first.
  const int m_block = kCausal ? num_m - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = static_cast<int>(blockIdx.y), b = bh / p.heads, h = bh % p.heads;
  const int key_end = kCausal ? min(p.seq, (m_block + 1) * kBM) : p.seq;
  const int n_blocks = (key_end + kBN - 1) / kBN;
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    mbar_init(&s.q_full, 1);
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&s.k_full[i], 1);
      mbar_init(&s.v_full[i], 1);
      mbar_init(&s.k_empty[i], kConsumerThreads);
      mbar_init(&s.v_empty[i], kConsumerThreads);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer: one thread drives the copy engine.
    regs_dealloc<24>();
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(&tm_q);
      tma_prefetch_descriptor(&tm_k);
      tma_prefetch_descriptor(&tm_v);
      mbar_arrive_expect_tx(&s.q_full, kBM * D * sizeof(E));
#pragma unroll
      for (int cb = 0; cb < kCB; ++cb) tma_load_4d(&s.q[cb][0][0], &tm_q, &s.q_full, cb * 64, m_block * kBM, h, b);
      for (int i = 0; i < n_blocks; ++i) {
        const int n = n_blocks - 1 - i, st = i % kStages;
        const unsigned phase = (i / kStages) & 1;
        mbar_wait(&s.k_empty[st], phase ^ 1);
        mbar_arrive_expect_tx(&s.k_full[st], kTileBytes);
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb)
          tma_load_4d(&s.k[st][cb][0][0], &tm_k, &s.k_full[st], cb * 64, n * kBN, h, b);
        mbar_wait(&s.v_empty[st], phase ^ 1);
        mbar_arrive_expect_tx(&s.v_full[st], kTileBytes);
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb)
          tma_load_4d(&s.v[st][cb][0][0], &tm_v, &s.v_full[st], cb * 64, n * kBN, h, b);
      }
    }
    return;
  }

  // ---- consumers: warpgroup wg owns query rows [row_base, row_base + 64) of the CTA tile.
  regs_alloc<240>();
  const int tid = static_cast<int>(threadIdx.x) - 128 * wg;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row_base = (wg - 1) * 64;
  const int row0 = m_block * kBM + row_base + 16 * warp + g;   // this thread's rows: row0, row0 + 8
  const int my_bar = wg, other_bar = 3 - wg;                    // named barriers 1 and 2
  const float sl2 = p.scale * kLog2e;

  float o[D / 2];
  float sacc[kBN / 2];
  std::uint32_t pf[kBN / 16][4];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, factor[2] = {1.f, 1.f};

  auto issue_s = [&](int st) {
    wgmma_fence();
    fence_regs(sacc);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int cb = kk / 4, kin = kk % 4;
      const std::uint64_t da = desc_k_major(smem_u32(&s.q[cb][row_base][0]) + kin * 32);
      const std::uint64_t db = desc_k_major(smem_u32(&s.k[st][cb][0][0]) + kin * 32);
      wgmma_ss<kBN, kF16, 0, 0>(sacc, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    fence_regs(sacc);
  };
  auto issue_pv = [&](int st) {
    wgmma_fence();
    fence_regs(o);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const std::uint64_t db = desc_mn_major(smem_u32(&s.v[st][0][0][0]) + kk * 2048, kBN * 128);
      wgmma_rs<D, kF16, 1>(o, pf[kk], db, 1);
    }
    wgmma_commit();
    fence_regs(o);
  };
  // Online softmax of the scores in sacc (key tile n): masks, running max and sum, P in place,
  // and the factor O must be rescaled by before P V is added.
  auto softmax = [&](int n, bool masked) {
    if (masked) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n * kBN + 8 * j + 2 * t + (e & 1), row = row0 + (e >= 2 ? 8 : 0);
          if (kCausal ? col > row : col >= p.seq) sacc[4 * j + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(sacc[4 * j + 2 * r], sacc[4 * j + 2 * r + 1]));
      mx = quad_max(mx) * sl2;
      const float m_new = fmaxf(m_run[r], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      factor[r] = fast_exp2(m_run[r] - m_use);
      m_run[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& x = sacc[4 * j + 2 * r + c];
          x = fast_exp2(fmaf(x, sl2, -m_use));
          sum += x;
        }
      l_run[r] = l_run[r] * factor[r] + sum;   // this thread's partial sum; the quad is summed at the end
    }
  };
  auto rescale_o = [&] {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j + 0] *= factor[0];
      o[4 * j + 1] *= factor[0];
      o[4 * j + 2] *= factor[1];
      o[4 * j + 3] *= factor[1];
    }
  };
  auto convert_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pf[kk][0] = pack2<E>(sacc[8 * kk + 0], sacc[8 * kk + 1]);
      pf[kk][1] = pack2<E>(sacc[8 * kk + 2], sacc[8 * kk + 3]);
      pf[kk][2] = pack2<E>(sacc[8 * kk + 4], sacc[8 * kk + 5]);
      pf[kk][3] = pack2<E>(sacc[8 * kk + 6], sacc[8 * kk + 7]);
    }
  };
  // Key tile n needs index compares when it reaches past this warpgroup's first row (causal) or
  // past the sequence end.
  const int wg_first_row = m_block * kBM + row_base;
  auto needs_mask = [&](int n) { return kCausal ? (n + 1) * kBN - 1 > wg_first_row : (n + 1) * kBN > p.seq; };

  // Warpgroup 2 lets warpgroup 1 take the first turn.
  if (wg == 2) named_arrive(1, kConsumerThreads);
  mbar_wait(&s.q_full, 0);

  // Turn 0: S of the first key tile.
  {
    const int n = n_blocks - 1;
    mbar_wait(&s.k_full[0], 0);
    named_sync(my_bar, kConsumerThreads);
    issue_s(0);
    if (!(wg == 2 && n_blocks == 1)) named_arrive(other_bar, kConsumerThreads);
    wgmma_wait<0>();
    fence_regs(sacc);
    mbar_arrive(&s.k_empty[0]);
    softmax(n, needs_mask(n));
    convert_p();
  }
  // Turns 1..n_blocks-1: S of tile i, then P V of tile i-1 while the softmax of tile i runs.
  for (int i = 1; i < n_blocks; ++i) {
    const int n = n_blocks - 1 - i, st = i % kStages, pst = (i - 1) % kStages;
    mbar_wait(&s.k_full[st], (i / kStages) & 1);
    named_sync(my_bar, kConsumerThreads);
    issue_s(st);
    rescale_o();
    mbar_wait(&s.v_full[pst], ((i - 1) / kStages) & 1);
    issue_pv(pst);
    if (!(wg == 2 && i == n_blocks - 1)) named_arrive(other_bar, kConsumerThreads);
    wgmma_wait<1>();
    fence_regs(sacc);
    mbar_arrive(&s.k_empty[st]);
    softmax(n, needs_mask(n));
    wgmma_wait<0>();
    fence_regs(o);
    mbar_arrive(&s.v_empty[pst]);
    convert_p();
  }
  // Last P V.
  {
    const int pst = (n_blocks - 1) % kStages;
    rescale_o();
    mbar_wait(&s.v_full[pst], ((n_blocks - 1) / kStages) & 1);
    issue_pv(pst);
    wgmma_wait<0>();
    fence_regs(o);
    mbar_arrive(&s.v_empty[pst]);
  }

  // Epilogue: O / l in the input dtype, lse = ln(sum exp(scale * s)) = m * ln2 + ln(l).
  E* out = static_cast<E*>(p.out) + static_cast<long long>(b) * p.o_stride_b +
           static_cast<long long>(h) * p.o_stride_h;   // o's own layout
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(l_run[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = row0 + 8 * r;
    if (row < p.seq) {
      E* dst = out + static_cast<long long>(row) * p.o_stride_t + 2 * t;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<std::uint32_t*>(dst + 8 * j) = pack2<E>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      if (t == 0) p.lse[static_cast<long long>(bh) * p.seq + row] = m_run[r] * kLn2 + logf(l);
    }
  }
#endif
}

template <class E, int D, bool kCausal>
void launch(const Params& p, const TmaMaps& maps, cudaStream_t stream) {
  auto kernel = flash_fwd_sm90_kernel<E, D, kCausal>;
  constexpr std::size_t smem = smem_bytes<E, D>();
  static const bool attr_ok = [&] {
    LMSCALE_ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)attr_ok;
  const dim3 grid(static_cast<unsigned>((p.seq + kBM - 1) / kBM), static_cast<unsigned>(p.batch * p.heads));
  kernel<<<grid, kThreads, smem, stream>>>(maps.q, maps.k, maps.v, p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

template <class E>
void launch_dim(const Params& p, const TmaMaps& maps, cudaStream_t stream) {
  if (p.head_dim == 64) return p.causal ? launch<E, 64, true>(p, maps, stream) : launch<E, 64, false>(p, maps, stream);
  if (p.head_dim == 128) return p.causal ? launch<E, 128, true>(p, maps, stream) : launch<E, 128, false>(p, maps, stream);
  throw_error("flash attention (sm90): head_dim 64 or 128 only");
}

}  // namespace lmscale::ops::cuda::attn::sm90_fwd

namespace lmscale::ops::cuda::attn {

namespace {
__global__ void sm90_probe_kernel(int* out) {
#ifdef LMSCALE_SM90_DEVICE
  *out = 1;
#else
  *out = 0;
#endif
}
}  // namespace

// Whether the device code of this binary was built for sm_90a (a build for other architectures
// compiles the kernels above to empty bodies): one tiny launch, asked once per process.
bool sm90_kernels_compiled() {
  int* flag = nullptr;
  if (cudaMalloc(&flag, sizeof(int)) != cudaSuccess) return false;
  int host = 0;
  sm90_probe_kernel<<<1, 1>>>(flag);
  const bool ok = cudaGetLastError() == cudaSuccess && cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(flag);
  return ok && host == 1;
}

void launch_flash_fwd_sm90(const Params& p, Elem e, const TmaMaps& maps, cudaStream_t stream) {
  if (e == Elem::bf16) return sm90_fwd::launch_dim<__nv_bfloat16>(p, maps, stream);
  if (e == Elem::f16) return sm90_fwd::launch_dim<__half>(p, maps, stream);
  throw_error("flash attention (sm90): bf16 or fp16 only");
}

}  // namespace lmscale::ops::cuda::attn
