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
// without the dQ part, then a dq kernel (one block per query tile, streaming key tiles:
// S = Q K^T, P = exp2(S - L), dP = dO V^T, dS = P (dP - D), dQ += dS K), no atomics.
// Causal: tiles wholly above the diagonal are skipped, diagonal tiles masked.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_kernels.h"
#include "attention_mma.cuh"

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
  const long long off = b * p.stride_b + h * p.stride_h + t * p.stride_t;
  const E* o = static_cast<const E*>(p.o) + off;
  const E* dout = static_cast<const E*>(p.dout) + off;
  float acc = 0.f;
  for (int e = lane; e < p.head_dim; e += 32) acc += to_float(o[e]) * to_float(dout[e]);
#pragma unroll
  for (int w = 16; w > 0; w >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, w);
  if (lane == 0) p.dsum[row] = acc;
}

// ---- dK, dV (and dQ's share): a block owns Bc = 16*MT*kWarps keys; query tiles of Br rows stream
// past. kKVInRegs keeps the warp's K and V A-fragments in registers for the whole loop (MT = 1,
// small D); otherwise they are re-read from shared memory for every query tile. kFuseDq: also
// dQacc[q] += dS[q, keys of the block] K[keys of the block] for every query tile (atomics).
template <class E, int D, int kWarps, int Br, int MT, bool kKVInRegs, bool kFuseDq>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dkdv_kernel(const Params p) {
  constexpr int Bc = 16 * MT * kWarps, kThreads = kWarps * 32, LD = D + 8;
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
  const E* dO = static_cast<const E*>(p.dout) + head;
  const float* lse = p.lse + static_cast<long long>(bh) * T;
  const float* dsum = p.dsum + static_cast<long long>(bh) * T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wkey0 = warp * 16 * MT, key0 = k0 + wkey0 + g;   // keys key0 + 16*mt + 8*hr
  const float sl2 = p.scale * kLog2e;

  const int q_begin = p.causal ? (k0 / Br) * Br : 0;   // earlier queries see none of these keys
  const int n_qtiles = (T - q_begin + Br - 1) / Br;

  auto load_q_tile = [&](int buf, int qs0) {
    load_tile<E, Br, D, kThreads>(Qs + buf * Br * LD, Q, ld, qs0, T);
    load_tile<E, Br, D, kThreads>(dOs + buf * Br * LD, dO, ld, qs0, T);
    for (int r = threadIdx.x; r < Br; r += kThreads) {
      const int q = qs0 + r;
      Ls[buf * Br + r] = q < T ? lse[q] * kLog2e : INFINITY;
      Ds[buf * Br + r] = q < T ? dsum[q] : 0.f;
    }
  };
  load_tile<E, Bc, D, kThreads>(Ks, K, ld, k0, T);
  load_tile<E, Bc, D, kThreads>(Vs, V, ld, k0, T);
  load_q_tile(0, q_begin);
  cp_async_commit();

  std::uint32_t kf[kKVInRegs ? MT : 1][kKVInRegs ? D / 16 : 1][4], vf[kKVInRegs ? MT : 1][kKVInRegs ? D / 16 : 1][4];
  float dk[MT][D / 8][4], dv[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
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
      for (int nd = 0; nd < D / 16; ++nd) {
        std::uint32_t bdo[4], bq[4];
        load_b_kn(bdo, dOt, LD, kk * 16, nd * 16);
        load_b_kn(bq, Qt, LD, kk * 16, nd * 16);
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
      // dQ[Br x D] += dS[Br x Bc] K[Bc x D]: warps tile the output (WM x WN warps, QM x QN 16x16
      // blocks each), k runs over the block's Bc keys. A = dS from the [key][q] tile (transposing
      // ldmatrix), B = K tile stored [key][d].
      constexpr int WN = (D / 16 < kWarps) ? D / 16 : kWarps, WM = kWarps / WN;
      constexpr int QM = Br / 16 / WM, QN = D / 16 / WN;
      static_assert(WN * WM == kWarps && QM * WM * 16 == Br && QN * WN * 16 == D, "dQ warp tiling");
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
          std::uint32_t bk[4];
          load_b_kn(bk, Ks, LD, kk * 16, (wn * QN + qn) * 16);
#pragma unroll
          for (int qm = 0; qm < QM; ++qm) {
            mma16816<E>(dq[qm][2 * qn], a[qm], bk);
            mma16816<E>(dq[qm][2 * qn + 1], a[qm], bk + 2);
          }
        }
      }
      float* acc = p.dq_accum + static_cast<long long>(bh) * T * D;
#pragma unroll
      for (int qm = 0; qm < QM; ++qm)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int q = qs0 + (wm * QM + qm) * 16 + hr * 8 + g;
          if (q < T) {
#pragma unroll
            for (int n = 0; n < 2 * QN; ++n) {
              float* dst = acc + static_cast<long long>(q) * D + wn * QN * 16 + n * 8 + 2 * t;
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
        for (int d = 0; d < D / 8; ++d) {
          const int col = d * 8 + 2 * t;
          *reinterpret_cast<std::uint32_t*>(dK + key * ld + col) =
              pack2<E>(dk[mt][d][2 * hr] * p.scale, dk[mt][d][2 * hr + 1] * p.scale);
          *reinterpret_cast<std::uint32_t*>(dV + key * ld + col) = pack2<E>(dv[mt][d][2 * hr], dv[mt][d][2 * hr + 1]);
        }
      }
    }
}

// ---- dQ: a block owns Br = 16*MT*kWarps queries; key tiles of Bc rows stream past ---------------
template <class E, int D, int kWarps, int Bc, int MT>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dq_kernel(const Params p) {
  constexpr int Br = 16 * MT * kWarps, kThreads = kWarps * 32, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* Qs = reinterpret_cast<E*>(smem_raw);   // [Br][LD]
  E* dOs = Qs + Br * LD;                    // [Br][LD]
  E* Ks = dOs + Br * LD;                    // [2][Bc][LD]
  E* Vs = Ks + 2 * Bc * LD;                 // [2][Bc][LD]

  const int T = p.seq;
  const int n_qtiles = (T + Br - 1) / Br;
  const int q0 = (p.causal ? n_qtiles - 1 - static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.y)) * Br;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long head = b * p.stride_b + h * p.stride_h, ld = p.stride_t;
  const E* Q = static_cast<const E*>(p.q) + head;
  const E* K = static_cast<const E*>(p.k) + head;
  const E* V = static_cast<const E*>(p.v) + head;
  const E* dO = static_cast<const E*>(p.dout) + head;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow0 = warp * 16 * MT, row0 = q0 + wrow0 + g;   // rows row0 + 16*mt + 8*hr
  const float sl2 = p.scale * kLog2e;
  const float* lse = p.lse + static_cast<long long>(bh) * T;
  const float* dsum = p.dsum + static_cast<long long>(bh) * T;
  float Lr[MT][2], Dr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = row0 + mt * 16 + hr * 8;
      Lr[mt][hr] = row < T ? lse[row] * kLog2e : 0.f;
      Dr[mt][hr] = row < T ? dsum[row] : 0.f;
    }

  const int kv_end = p.causal ? min(T, q0 + Br) : T;
  const int n_ktiles = (kv_end + Bc - 1) / Bc;

  load_tile<E, Br, D, kThreads>(Qs, Q, ld, q0, T);
  load_tile<E, Br, D, kThreads>(dOs, dO, ld, q0, T);
  load_tile<E, Bc, D, kThreads>(Ks, K, ld, 0, T);
  load_tile<E, Bc, D, kThreads>(Vs, V, ld, 0, T);
  cp_async_commit();

  std::uint32_t qf[MT][D / 16][4], df[MT][D / 16][4];
  float dq[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int d = 0; d < D / 8; ++d) dq[mt][d][0] = dq[mt][d][1] = dq[mt][d][2] = dq[mt][d][3] = 0.f;

  for (int j = 0; j < n_ktiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < n_ktiles) {
      const int nb = (j + 1) & 1;
      load_tile<E, Bc, D, kThreads>(Ks + nb * Bc * LD, K, ld, (j + 1) * Bc, T);
      load_tile<E, Bc, D, kThreads>(Vs + nb * Bc * LD, V, ld, (j + 1) * Bc, T);
      cp_async_commit();
    }
    if (j == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          load_a(qf[mt][kk], Qs, LD, wrow0 + mt * 16, kk * 16);
          load_a(df[mt][kk], dOs, LD, wrow0 + mt * 16, kk * 16);
        }
    }
    const E* Kt = Ks + (j & 1) * Bc * LD;
    const E* Vt = Vs + (j & 1) * Bc * LD;

    // S = Q K^T and dP = dO V^T   [16*MT rows x Bc keys] per warp
    float s[MT][Bc / 8][4], dp[MT][Bc / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[mt][n][i] = dp[mt][n][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nb = 0; nb < Bc / 16; ++nb) {
        std::uint32_t bk[4], bv[4];
        load_b_nk(bk, Kt, LD, nb * 16, kk * 16);
        load_b_nk(bv, Vt, LD, nb * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<E>(s[mt][2 * nb], qf[mt][kk], bk);
          mma16816<E>(s[mt][2 * nb + 1], qf[mt][kk], bk + 2);
          mma16816<E>(dp[mt][2 * nb], df[mt][kk], bv);
          mma16816<E>(dp[mt][2 * nb + 1], df[mt][kk], bv + 2);
        }
      }
    }
    // P = exp2(S*c - L), masked to 0; dS = P (dP - D), kept in s.
    const int k0 = j * Bc;
    const bool need_mask = (k0 + Bc > T) || (p.causal && k0 + Bc - 1 > q0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int hr = i >> 1;
          float pv = exp2f(fmaf(s[mt][n][i], sl2, -Lr[mt][hr]));
          if (need_mask) {
            const int key = k0 + n * 8 + 2 * t + (i & 1);
            if (key >= T || (p.causal && key > row0 + mt * 16 + hr * 8)) pv = 0.f;
          }
          s[mt][n][i] = pv * (dp[mt][n][i] - Dr[mt][hr]);
        }
    // dQ += dS K: B = K tile stored [key][d] = [k][n]; each fragment feeds MT row blocks.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      std::uint32_t da[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        da[mt][0] = pack2<E>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        da[mt][1] = pack2<E>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        da[mt][2] = pack2<E>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        da[mt][3] = pack2<E>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        std::uint32_t bf[4];
        load_b_kn(bf, Kt, LD, kk * 16, nd * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<E>(dq[mt][2 * nd], da[mt], bf);
          mma16816<E>(dq[mt][2 * nd + 1], da[mt], bf + 2);
        }
      }
    }
  }

  E* dQ = static_cast<E*>(p.dq) + head;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = row0 + mt * 16 + hr * 8;
      if (row < T) {
#pragma unroll
        for (int d = 0; d < D / 8; ++d)
          *reinterpret_cast<std::uint32_t*>(dQ + row * ld + d * 8 + 2 * t) =
              pack2<E>(dq[mt][d][2 * hr] * p.scale, dq[mt][d][2 * hr + 1] * p.scale);
      }
    }
}

// dQ = scale * dQacc in E: one thread per 8 elements (a 16-byte store; rows are 16-byte aligned on
// the tensor-core path).
template <class E>
__global__ void flash_bwd_dq_convert_kernel(const Params p) {
  const int D = p.head_dim, chunks_per_row = D / 8;
  const long long chunk = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= static_cast<long long>(p.batch) * p.heads * p.seq * chunks_per_row) return;
  const long long row = chunk / chunks_per_row;   // bh * T + t
  const int col = static_cast<int>(chunk % chunks_per_row) * 8;
  const long long bh = row / p.seq, t = row % p.seq, b = bh / p.heads, h = bh % p.heads;
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + row * D + col);
  const float4 x = src[0], y = src[1];
  const float c = p.scale;
  uint4 out;
  out.x = pack2<E>(x.x * c, x.y * c);
  out.y = pack2<E>(x.z * c, x.w * c);
  out.z = pack2<E>(y.x * c, y.y * c);
  out.w = pack2<E>(y.z * c, y.w * c);
  *reinterpret_cast<uint4*>(static_cast<E*>(p.dq) + b * p.stride_b + h * p.stride_h + t * p.stride_t + col) = out;
}

template <class E, int D, int kWarps, int Br, int MT, bool kKVInRegs, bool kFuseDq = false>
void launch_dkdv(const Params& p, cudaStream_t stream) {
  constexpr int Bc = 16 * MT * kWarps;
  const std::size_t smem = static_cast<std::size_t>(2 * Bc + 4 * Br) * (D + 8) * sizeof(E) + 4 * Br * sizeof(float) +
                           (kFuseDq ? static_cast<std::size_t>(Bc) * (Br + 8) * sizeof(E) : 0);
  auto kernel = flash_bwd_dkdv_kernel<E, D, kWarps, Br, MT, kKVInRegs, kFuseDq>;
  // Once per kernel instantiation (the process drives one GPU): raising the dynamic shared-memory
  // limit on every launch measurably slowed back-to-back calls.
  static const bool smem_ok = [&] {
    LMSCALE_ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)smem_ok;
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq + Bc - 1) / Bc));
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

template <class E, int D, int kWarps, int Bc, int MT>
void launch_dq(const Params& p, cudaStream_t stream) {
  constexpr int Br = 16 * MT * kWarps;
  const std::size_t smem = static_cast<std::size_t>(2 * Br + 4 * Bc) * (D + 8) * sizeof(E);
  auto kernel = flash_bwd_dq_kernel<E, D, kWarps, Bc, MT>;
  // Once per kernel instantiation (the process drives one GPU): raising the dynamic shared-memory
  // limit on every launch measurably slowed back-to-back calls.
  static const bool smem_ok = [&] {
    LMSCALE_ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)smem_ok;
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq + Br - 1) / Br));
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

// Fused path: zero dQacc, dkdv with dQ's share added by atomics, convert dQacc to dQ.
template <class E, int D, int kWarps, int Br, int MT, bool kKVInRegs>
void launch_fused(const Params& p, cudaStream_t stream) {
  if (p.dq_accum == nullptr) throw_error("flash attention backward (tensor cores): no dQ accumulator");
  const long long elems = static_cast<long long>(p.batch) * p.heads * p.seq * D;
  LMSCALE_ATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, static_cast<std::size_t>(elems) * sizeof(float), stream));
  launch_dkdv<E, D, kWarps, Br, MT, kKVInRegs, true>(p, stream);
  constexpr int kThreads = 256;
  const unsigned blocks = static_cast<unsigned>((elems / 8 + kThreads - 1) / kThreads);
  flash_bwd_dq_convert_kernel<E><<<blocks, kThreads, 0, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

template <class E>
void launch_dim(const Params& p, cudaStream_t stream, int variant) {
  // launch_dkdv<E, D, kWarps, Br, MT, kKVInRegs>: Bc = 16*MT*kWarps keys per block, Br queries per
  // step. launch_dq<E, D, kWarps, Bc, MT>: Br = 16*MT*kWarps queries per block, Bc keys per step.
  // launch_fused<E, D, kWarps, Br, MT, kKVInRegs> is the same geometry with dQ fused (atomics).
  switch (p.head_dim) {
    case 16:
      if (variant == 1) {
        launch_dkdv<E, 16, 4, 64, 1, true>(p, stream);
        return launch_dq<E, 16, 4, 64, 2>(p, stream);
      }
      return launch_fused<E, 16, 4, 64, 1, true>(p, stream);
    case 32:
      if (variant == 1) {
        launch_dkdv<E, 32, 4, 64, 1, true>(p, stream);
        return launch_dq<E, 32, 4, 32, 2>(p, stream);
      }
      return launch_fused<E, 32, 4, 64, 1, true>(p, stream);
    case 64:
      // Variants for tuning (DISABLED_TimingLeaderboard in ctest/gpu/test_attention_cuda.cpp);
      // 0 is the default; 1 is the deterministic two-kernel path (no atomics).
      if (variant == 1) {
        launch_dkdv<E, 64, 4, 32, 2, false>(p, stream);
        return launch_dq<E, 64, 4, 32, 2>(p, stream);
      }
      if (variant == 2) return launch_fused<E, 64, 8, 32, 1, true>(p, stream);
      if (variant == 3) return launch_fused<E, 64, 4, 16, 2, false>(p, stream);
      if (variant == 4) return launch_fused<E, 64, 8, 32, 2, false>(p, stream);
      return launch_fused<E, 64, 4, 32, 2, false>(p, stream);
    case 128:
      if (variant == 1) {
        launch_dkdv<E, 128, 4, 32, 1, false>(p, stream);
        return launch_dq<E, 128, 4, 32, 1>(p, stream);
      }
      return launch_fused<E, 128, 4, 32, 1, false>(p, stream);
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

void launch_flash_bwd_mma(const Params& p, Elem e, cudaStream_t stream) { launch_flash_bwd_mma_variant(p, e, stream, 0); }

}  // namespace lmscale::ops::cuda::attn
