// FlashAttention-2 backward on tensor cores (bf16/fp16 in, fp32 accumulate), Algorithm 2 of Dao
// (2023) with P recomputed from the saved lse. Default (fused, 5 products per tile pair):
//  1. dsum: D = rowsum(dO * O)                                   (fp32 [B,H,T]); dQacc = 0
//  2. dkdv: one block per key tile (Bc = 16*MT*kWarps keys), streaming query tiles of Br rows:
//     S^T = K Q^T, P^T = exp2(S^T - L), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D),
//     dK += dS^T Q (eqs. 13-19; dK, dV accumulate in registers); dS^T goes to shared memory and
//     the block adds dS K (its Bc keys' share of dQ, [Br x D]) to the fp32 accumulator
//     dQacc [B*H, T, D] with float2 atomics (red.global.add.v2.f32).
//  3. convert: dQ = scale * dQacc in the input dtype and layout.
// The atomics make dQ's last bits depend on the order key blocks arrive in (not deterministic).
// Deterministic alternative (variant 1, the previous default, 7 products per tile pair): dkdv
// without the dQ part, then a dq kernel (flash_attention_bwd_dq.cu), no atomics.
// Causal: tiles wholly above the diagonal are skipped, diagonal tiles masked.
// Head dims: compiled for a padded width D (multiples of 16 up to 128, of 32 up to 256), run for
// any real head dim p.head_dim <= D that is a multiple of 8; columns past it are zero-filled in
// shared memory and never stored. Above 128 the dK/dV accumulators (16 keys x D per warp, twice)
// no longer fit in registers: the dkdv kernel then owns a column chunk [c0, c0 + DC) of dK, dV and
// dQ per block (grid.z = D / DC chunks) and every chunk recomputes S^T and dP^T over all D columns
// (7 products per tile pair over two chunks instead of 5).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "attention_kernels.h"
#include "attention_mma.cuh"
#include "flash_attention_sm90.h"

namespace lmscale::ops::cuda::attn {

namespace {

// One warp per row: D[bh*T + t] = sum_e dO[e] * O[e].
template <class E>
__global__ void flash_bwd_dsum_kernel(const Params p) {
  const long long rows = static_cast<long long>(p.batch) * p.heads * p.seq;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int t = static_cast<int>(row % p.seq);
  const long long bh = row / p.seq, b = bh / p.heads, h = bh % p.heads;
  const long long off = b * p.o_stride_b + h * p.o_stride_h + t * p.o_stride_t;   // O and dO's layout
  const E* o = static_cast<const E*>(p.o) + off;
  const E* dout = static_cast<const E*>(p.dout) + off;
  float acc = 0.f;
  for (int e = lane; e < p.head_dim; e += 32) acc += to_float(o[e]) * to_float(dout[e]);
#pragma unroll
  for (int w = 16; w > 0; w >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, w);
  if (lane == 0) p.dsum[row] = acc;
}

// Warp grid of the fused dQ part: the block's [Br x DC] share of dQ is NR x NC blocks of 16x16
// over kWarps warps. First choice (the tuned layout of D = 64 and 128): WN = min(NC, kWarps) warp
// columns when that tiles exactly. Otherwise (NC = 3, 5, 6, 7 for D = 48, 80, 96, 112) WM = the
// largest divisor of kWarps that divides NR, WN = kWarps / WM, and each warp takes QN = ceil(NC/WN)
// column blocks, the last warp column fewer when WN does not divide NC (kRagged).
template <int kWarps, int NR, int NC>
struct DqTiling {
  static constexpr int WN0 = NC < kWarps ? NC : kWarps;
  static constexpr bool kExact0 = kWarps % WN0 == 0 && NR % (kWarps / WN0) == 0 && NC % WN0 == 0;
  static constexpr int wm_fallback() {
    int w = kWarps;
    while (w > 1 && (kWarps % w != 0 || NR % w != 0)) --w;
    return w;
  }
  static constexpr int WM = kExact0 ? kWarps / WN0 : wm_fallback();
  static constexpr int WN = kWarps / WM;
  static constexpr int QM = NR / WM;
  static constexpr int QN = (NC + WN - 1) / WN;
  static constexpr bool kRagged = QN * WN != NC;
  static_assert(QM * WM == NR, "dQ warp rows");
};

// ---- dK, dV (and dQ's share): a block owns Bc = 16*MT*kWarps keys; query tiles of Br rows stream
// past. kKVInRegs keeps the warp's K and V A-fragments in registers for the whole loop (MT = 1,
// small D); otherwise they are re-read from shared memory for every query tile. kFuseDq: also
// dQacc[q] += dS[q, keys of the block] K[keys of the block] for every query tile (atomics).
// DC: output columns per block (D, or D / 2 above 128: blockIdx.z picks the chunk).
template <class E, int D, int kWarps, int Br, int MT, bool kKVInRegs, bool kFuseDq, int DC = D>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dkdv_kernel(const Params p) {
  constexpr int Bc = 16 * MT * kWarps, kThreads = kWarps * 32, LD = D + 8;
  static_assert(D % DC == 0 && DC % 16 == 0, "column chunks of 16-column blocks");
  const int dreal = p.head_dim;                         // multiple of 8, <= D
  const int c0 = DC == D ? 0 : static_cast<int>(blockIdx.z) * DC;   // this block's output columns [c0, c0 + DC)
  constexpr int LDS = Br + 8;   // dS^T tile row stride (padded: conflict-free stores and ldmatrix)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* Ks = reinterpret_cast<E*>(smem_raw);   // [Bc][LD]
  E* Vs = Ks + Bc * LD;                     // [Bc][LD]
  E* Qs = Vs + Bc * LD;                     // [2][Br][LD]
  E* dOs = Qs + 2 * Br * LD;                // [2][Br][LD]
  float* Ls = reinterpret_cast<float*>(dOs + 2 * Br * LD);   // [2][Br] lse in log2 units (+inf past T)
  float* Ds = Ls + 2 * Br;                                    // [2][Br] rowsum(dO*O) (0 past T)
  E* dSs = reinterpret_cast<E*>(Ds + 2 * Br);                 // [Bc][LDS] dS^T (kFuseDq only)

  const int T = p.seq;
  const int k0 = static_cast<int>(blockIdx.y) * Bc;   // causal: low key tiles have the most work; they go first
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long head = b * p.stride_b + h * p.stride_h, ld = p.stride_t;
  const E* Q = static_cast<const E*>(p.q) + head;
  const E* K = static_cast<const E*>(p.k) + head;
  const E* V = static_cast<const E*>(p.v) + head;
  const E* dO = static_cast<const E*>(p.dout) + b * p.o_stride_b + h * p.o_stride_h;   // dO's own layout
  const long long ldo = p.o_stride_t;
  const float* lse = p.lse + static_cast<long long>(bh) * T;
  const float* dsum = p.dsum + static_cast<long long>(bh) * T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wkey0 = warp * 16 * MT, key0 = k0 + wkey0 + g;   // keys key0 + 16*mt + 8*hr
  const float sl2 = p.scale * kLog2e;

  const int q_begin = p.causal ? (k0 / Br) * Br : 0;   // earlier queries see none of these keys
  const int n_qtiles = (T - q_begin + Br - 1) / Br;

  auto load_q_tile = [&](int buf, int qs0) {
    load_tile<E, Br, D, kThreads>(Qs + buf * Br * LD, Q, ld, qs0, T, dreal);
    load_tile<E, Br, D, kThreads>(dOs + buf * Br * LD, dO, ldo, qs0, T, dreal);
    for (int r = threadIdx.x; r < Br; r += kThreads) {
      const int q = qs0 + r;
      Ls[buf * Br + r] = q < T ? lse[q] * kLog2e : INFINITY;
      Ds[buf * Br + r] = q < T ? dsum[q] : 0.f;
    }
  };
  load_tile<E, Bc, D, kThreads>(Ks, K, ld, k0, T, dreal);
  load_tile<E, Bc, D, kThreads>(Vs, V, ld, k0, T, dreal);
  load_q_tile(0, q_begin);
  cp_async_commit();

  std::uint32_t kf[kKVInRegs ? MT : 1][kKVInRegs ? D / 16 : 1][4], vf[kKVInRegs ? MT : 1][kKVInRegs ? D / 16 : 1][4];
  float dk[MT][DC / 8][4], dv[MT][DC / 8][4];   // columns c0 .. c0 + DC - 1
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int d = 0; d < DC / 8; ++d)
#pragma unroll
      for (int i = 0; i < 4; ++i) dk[mt][d][i] = dv[mt][d][i] = 0.f;

  for (int it = 0; it < n_qtiles; ++it) {
    const int qs0 = q_begin + it * Br;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < n_qtiles) {
      load_q_tile((it + 1) & 1, qs0 + Br);
      cp_async_commit();
    }
    if constexpr (kKVInRegs) {
      if (it == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            load_a(kf[mt][kk], Ks, LD, wkey0 + mt * 16, kk * 16);
            load_a(vf[mt][kk], Vs, LD, wkey0 + mt * 16, kk * 16);
          }
      }
    }
    const E* Qt = Qs + (it & 1) * Br * LD;
    const E* dOt = dOs + (it & 1) * Br * LD;
    const float* Lt = Ls + (it & 1) * Br;
    const float* Dt = Ds + (it & 1) * Br;

    // S^T = K Q^T and dP^T = V dO^T   [16*MT keys x Br queries] per warp
    float s[MT][Br / 8][4], dp[MT][Br / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Br / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[mt][n][i] = dp[mt][n][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t ka[MT][4], va[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kKVInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) ka[mt][i] = kf[mt][kk][i], va[mt][i] = vf[mt][kk][i];
        } else {
          load_a(ka[mt], Ks, LD, wkey0 + mt * 16, kk * 16);
          load_a(va[mt], Vs, LD, wkey0 + mt * 16, kk * 16);
        }
      }
#pragma unroll
      for (int nb = 0; nb < Br / 16; ++nb) {
        std::uint32_t bq[4], bd[4];
        load_b_nk(bq, Qt, LD, nb * 16, kk * 16);
        load_b_nk(bd, dOt, LD, nb * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<E>(s[mt][2 * nb], ka[mt], bq);
          mma16816<E>(s[mt][2 * nb + 1], ka[mt], bq + 2);
          mma16816<E>(dp[mt][2 * nb], va[mt], bd);
          mma16816<E>(dp[mt][2 * nb + 1], va[mt], bd + 2);
        }
      }
    }
    // P^T = exp2(S^T * scale*log2e - L); dS^T = P^T (dP^T - D). Causal mask on diagonal tiles.
    const bool need_mask = p.causal && k0 + Bc - 1 > qs0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Br / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int ql = n * 8 + 2 * t + (i & 1);
          float pv = exp2f(fmaf(s[mt][n][i], sl2, -Lt[ql]));
          if (need_mask && key0 + mt * 16 + (i >> 1) * 8 > qs0 + ql) pv = 0.f;
          s[mt][n][i] = pv;
          dp[mt][n][i] = pv * (dp[mt][n][i] - Dt[ql]);
        }
    if constexpr (kFuseDq) {
      // dS^T rounded to E into shared memory (read back after the barrier below by all warps).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < Br / 8; ++n)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr)
            *reinterpret_cast<std::uint32_t*>(dSs + (wkey0 + mt * 16 + hr * 8 + g) * LDS + n * 8 + 2 * t) =
                pack2<E>(dp[mt][n][2 * hr], dp[mt][n][2 * hr + 1]);
    }
    // dV += P^T dO and dK += dS^T Q: A from the accumulators, B = dO / Q tiles stored [q][d].
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk) {
      std::uint32_t pa[MT][4], da[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack2<E>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<E>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<E>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<E>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        da[mt][0] = pack2<E>(dp[mt][2 * kk][0], dp[mt][2 * kk][1]);
        da[mt][1] = pack2<E>(dp[mt][2 * kk][2], dp[mt][2 * kk][3]);
        da[mt][2] = pack2<E>(dp[mt][2 * kk + 1][0], dp[mt][2 * kk + 1][1]);
        da[mt][3] = pack2<E>(dp[mt][2 * kk + 1][2], dp[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int nd = 0; nd < DC / 16; ++nd) {
        std::uint32_t bdo[4], bq[4];
        load_b_kn(bdo, dOt, LD, kk * 16, c0 + nd * 16);
        load_b_kn(bq, Qt, LD, kk * 16, c0 + nd * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<E>(dv[mt][2 * nd], pa[mt], bdo);
          mma16816<E>(dv[mt][2 * nd + 1], pa[mt], bdo + 2);
          mma16816<E>(dk[mt][2 * nd], da[mt], bq);
          mma16816<E>(dk[mt][2 * nd + 1], da[mt], bq + 2);
        }
      }
    }
    if constexpr (kFuseDq) {
      __syncthreads();   // dS^T of all warps is in dSs (the next iteration's first barrier guards reuse)
      // dQ[Br x DC] += dS[Br x Bc] K[Bc x DC] (this block's column chunk): warps tile the output
      // (WM x WN warps, QM x QN 16x16 blocks each; see DqTiling), k runs over the block's Bc keys.
      // A = dS from the [key][q] tile (transposing ldmatrix), B = K tile stored [key][d].
      using Tl = DqTiling<kWarps, Br / 16, DC / 16>;
      constexpr int WN = Tl::WN, QM = Tl::QM, QN = Tl::QN;
      const int wm = warp / WN, wn = warp % WN;
      float dq[QM][2 * QN][4];
#pragma unroll
      for (int qm = 0; qm < QM; ++qm)
#pragma unroll
        for (int n = 0; n < 2 * QN; ++n) dq[qm][n][0] = dq[qm][n][1] = dq[qm][n][2] = dq[qm][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
        std::uint32_t a[QM][4];
#pragma unroll
        for (int qm = 0; qm < QM; ++qm) load_a_km(a[qm], dSs, LDS, (wm * QM + qm) * 16, kk * 16);
#pragma unroll
        for (int qn = 0; qn < QN; ++qn) {
          if (Tl::kRagged && wn * QN + qn >= DC / 16) break;   // warp-uniform: this warp's last blocks
          std::uint32_t bk[4];
          load_b_kn(bk, Ks, LD, kk * 16, c0 + (wn * QN + qn) * 16);
#pragma unroll
          for (int qm = 0; qm < QM; ++qm) {
            mma16816<E>(dq[qm][2 * qn], a[qm], bk);
            mma16816<E>(dq[qm][2 * qn + 1], a[qm], bk + 2);
          }
        }
      }
      // dQacc rows have the padded width D (compile-time stride; the padded columns receive zeros and
      // are never converted), so no column predicate is needed here.
      float* acc = p.dq_accum + static_cast<long long>(bh) * T * D;   // [T][D] of this head
#pragma unroll
      for (int qm = 0; qm < QM; ++qm)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int q = qs0 + (wm * QM + qm) * 16 + hr * 8 + g;
          if (q < T) {
#pragma unroll
            for (int n = 0; n < 2 * QN; ++n) {
              if (Tl::kRagged && wn * QN * 2 + n >= DC / 8) continue;   // past this warp's last block
              float* dst = acc + static_cast<long long>(q) * D + c0 + wn * QN * 16 + n * 8 + 2 * t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
              atomicAdd(reinterpret_cast<float2*>(dst), make_float2(dq[qm][n][2 * hr], dq[qm][n][2 * hr + 1]));
#else
              atomicAdd(dst, dq[qm][n][2 * hr]);
              atomicAdd(dst + 1, dq[qm][n][2 * hr + 1]);
#endif
            }
          }
        }
    }
  }

  E* dK = static_cast<E*>(p.dk) + head;
  E* dV = static_cast<E*>(p.dv) + head;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int key = key0 + mt * 16 + hr * 8;
      if (key < T) {
#pragma unroll
        for (int d = 0; d < DC / 8; ++d) {
          if (c0 + d * 8 >= dreal) continue;   // padded columns
          const int col = c0 + d * 8 + 2 * t;
          *reinterpret_cast<std::uint32_t*>(dK + key * ld + col) =
              pack2<E>(dk[mt][d][2 * hr] * p.scale, dk[mt][d][2 * hr + 1] * p.scale);
          *reinterpret_cast<std::uint32_t*>(dV + key * ld + col) = pack2<E>(dv[mt][d][2 * hr], dv[mt][d][2 * hr + 1]);
        }
      }
    }
}

// dQ = scale * dQacc in E: one thread per 8 elements (a 16-byte store; rows are 16-byte aligned on
// the tensor-core path). dQacc rows are padded_head_dim(D) floats apart; only the first D are read.
template <class E>
__global__ void flash_bwd_dq_convert_kernel(const Params p) {
  const int D = p.head_dim, chunks_per_row = D / 8, ld_acc = padded_head_dim(D);
  const long long chunk = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= static_cast<long long>(p.batch) * p.heads * p.seq * chunks_per_row) return;
  const long long row = chunk / chunks_per_row;   // bh * T + t
  const int col = static_cast<int>(chunk % chunks_per_row) * 8;
  const long long bh = row / p.seq, t = row % p.seq, b = bh / p.heads, h = bh % p.heads;
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + row * ld_acc + col);
  const float4 x = src[0], y = src[1];
  const float c = p.scale;
  uint4 out;
  out.x = pack2<E>(x.x * c, x.y * c);
  out.y = pack2<E>(x.z * c, x.w * c);
  out.z = pack2<E>(y.x * c, y.y * c);
  out.w = pack2<E>(y.z * c, y.w * c);
  *reinterpret_cast<uint4*>(static_cast<E*>(p.dq) + b * p.stride_b + h * p.stride_h + t * p.stride_t + col) = out;
}

template <class E>
void launch_dq_convert(const Params& p, cudaStream_t stream) {
  const long long elems = static_cast<long long>(p.batch) * p.heads * p.seq * p.head_dim;   // converted 8 per thread
  constexpr int kThreads = 256;
  const unsigned blocks = static_cast<unsigned>((elems / 8 + kThreads - 1) / kThreads);
  flash_bwd_dq_convert_kernel<E><<<blocks, kThreads, 0, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

template <class E, int D, int kWarps, int Br, int MT, bool kKVInRegs, bool kFuseDq = false, int DC = D>
void launch_dkdv(const Params& p, cudaStream_t stream) {
  constexpr int Bc = 16 * MT * kWarps;
  const std::size_t smem = static_cast<std::size_t>(2 * Bc + 4 * Br) * (D + 8) * sizeof(E) + 4 * Br * sizeof(float) +
                           (kFuseDq ? static_cast<std::size_t>(Bc) * (Br + 8) * sizeof(E) : 0);
  auto kernel = flash_bwd_dkdv_kernel<E, D, kWarps, Br, MT, kKVInRegs, kFuseDq, DC>;
  // Once per kernel instantiation (the process drives one GPU): raising the dynamic shared-memory
  // limit on every launch measurably slowed back-to-back calls.
  static const bool smem_ok = [&] {
    LMSCALE_ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)smem_ok;
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq + Bc - 1) / Bc), D / DC);
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

// Fused path: zero dQacc, dkdv with dQ's share added by atomics, convert dQacc to dQ.
template <class E, int D, int kWarps, int Br, int MT, bool kKVInRegs, int DC = D>
void launch_fused(const Params& p, cudaStream_t stream) {
  if (p.dq_accum == nullptr) throw_error("flash attention backward (tensor cores): no dQ accumulator");
  // dQacc is [B*H, T, D] with the padded head dim D (= padded_head_dim(p.head_dim)).
  const long long rows = static_cast<long long>(p.batch) * p.heads * p.seq;
  LMSCALE_ATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, static_cast<std::size_t>(rows * D) * sizeof(float), stream));
  launch_dkdv<E, D, kWarps, Br, MT, kKVInRegs, true, DC>(p, stream);
  launch_dq_convert<E>(p, stream);
}

template <class E>
constexpr Elem kElem = std::is_same_v<E, __half> ? Elem::f16 : Elem::bf16;

// Tile shape per padded head dim. launch_fused<E, D, kWarps, Br, MT, kKVInRegs(, DC)>: Bc =
// 16*MT*kWarps keys per block, Br queries per step, dQ fused (atomics), DC output columns per block
// (D / 2 above 128). Registers per thread grow as D/2*MT*2 (dK, dV; DC instead of D when split) +
// Br/2*MT*2 (S^T, dP^T) + the dQ part; shapes were chosen so that ptxas reports no spills (the D = 64
// default has a tuned 8-byte one). Variant 1: the deterministic two-kernel path (launch_dkdv without
// dQ, then the dq kernel of flash_attention_bwd_dq.cu).
template <class E>
void launch_dim(const Params& p, cudaStream_t stream, int variant) {
  switch (padded_head_dim(p.head_dim)) {
    case 16:
      if (variant == 1) {
        launch_dkdv<E, 16, 4, 64, 1, true>(p, stream);
        return launch_flash_bwd_dq_deterministic(p, kElem<E>, stream);
      }
      return launch_fused<E, 16, 4, 64, 1, true>(p, stream);
    case 32:
      if (variant == 1) {
        launch_dkdv<E, 32, 4, 64, 1, true>(p, stream);
        return launch_flash_bwd_dq_deterministic(p, kElem<E>, stream);
      }
      return launch_fused<E, 32, 4, 64, 1, true>(p, stream);
    case 48: return launch_fused<E, 48, 4, 64, 1, true>(p, stream);
    case 64:
      if (variant == 1) {
        launch_dkdv<E, 64, 4, 32, 2, false>(p, stream);
        return launch_flash_bwd_dq_deterministic(p, kElem<E>, stream);
      }
      return launch_fused<E, 64, 4, 32, 2, false>(p, stream);
    case 80:   // the 2.7B preset's head dim; other shapes tried are in docs/attention.md
      return launch_fused<E, 80, 4, 64, 1, true>(p, stream);
    case 96: return launch_fused<E, 96, 4, 32, 1, false>(p, stream);
    case 112: return launch_fused<E, 112, 4, 32, 1, false>(p, stream);
    case 128:
      if (variant == 1) {
        launch_dkdv<E, 128, 4, 32, 1, false>(p, stream);
        return launch_flash_bwd_dq_deterministic(p, kElem<E>, stream);
      }
      return launch_fused<E, 128, 4, 32, 1, false>(p, stream);
    case 160:
      // 32 queries per step: 91 KB of shared memory, 2 blocks per SM (variant 2, 64 queries: 138 KB, 1).
      if (variant == 2) return launch_fused<E, 160, 4, 64, 1, false, 80>(p, stream);
      return launch_fused<E, 160, 4, 32, 1, false, 80>(p, stream);
    case 192: return launch_fused<E, 192, 4, 32, 1, false, 96>(p, stream);
    case 224: return launch_fused<E, 224, 4, 32, 1, false, 112>(p, stream);
    case 256: return launch_fused<E, 256, 4, 32, 1, false, 128>(p, stream);
    default: throw_unsupported_head_dim(p.head_dim);
  }
}

}  // namespace

void launch_flash_bwd_dsum(const Params& p, Elem e, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.batch) * p.heads * p.seq;
  constexpr int kWarpsPerBlock = 8;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (e == Elem::bf16)
    flash_bwd_dsum_kernel<__nv_bfloat16><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(p);
  else if (e == Elem::f16)
    flash_bwd_dsum_kernel<__half><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(p);
  else
    flash_bwd_dsum_kernel<float><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

void launch_flash_bwd_mma_variant(const Params& p, Elem e, cudaStream_t stream, int variant) {
  if (e == Elem::bf16) return launch_dim<__nv_bfloat16>(p, stream, variant);
  if (e == Elem::f16) return launch_dim<__half>(p, stream, variant);
  throw_error("flash attention backward (tensor cores): bf16 or fp16 only");
}

void launch_flash_bwd_dq_convert(const Params& p, Elem e, cudaStream_t stream) {
  if (e == Elem::bf16) return launch_dq_convert<__nv_bfloat16>(p, stream);
  if (e == Elem::f16) return launch_dq_convert<__half>(p, stream);
  throw_error("flash attention backward: dQ convert is for bf16 or fp16");
}

void launch_flash_bwd_mma(const Params& p, Elem e, cudaStream_t stream) { launch_flash_bwd_mma_variant(p, e, stream, 0); }

}  // namespace lmscale::ops::cuda::attn
