// The dQ kernel of the deterministic (atomic-free) FlashAttention-2 backward on tensor cores,
// variant 1 of launch_flash_bwd_mma_variant (flash_attention_bwd.cu runs its dK/dV kernel without
// the dQ part first): one block per query tile of Br = 16*MT*kWarps rows, key tiles of Bc rows
// streamed through shared memory (double-buffered, cp.async):
//   S = Q K^T, P = exp2(S*scale*log2e - L), dP = dO V^T, dS = P (dP - D), dQ += dS K
// with dQ accumulated in registers and written once (no atomics: bit-reproducible). Head dims 16,
// 32, 64, 128 (the issue-5 widths; real head dims up to the width, columns past it zero-filled).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_kernels.h"
#include "attention_mma.cuh"

namespace lmscale::ops::cuda::attn {

namespace {

// ---- dQ: a block owns Br = 16*MT*kWarps queries; key tiles of Bc rows stream past ---------------
template <class E, int D, int kWarps, int Bc, int MT>
__global__ void __launch_bounds__(kWarps * 32) flash_bwd_dq_kernel(const Params p) {
  constexpr int Br = 16 * MT * kWarps, kThreads = kWarps * 32, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* Qs = reinterpret_cast<E*>(smem_raw);   // [Br][LD]
  E* dOs = Qs + Br * LD;                    // [Br][LD]
  E* Ks = dOs + Br * LD;                    // [2][Bc][LD]
  E* Vs = Ks + 2 * Bc * LD;                 // [2][Bc][LD]

  const int T = p.seq, dreal = p.head_dim;
  const int n_qtiles = (T + Br - 1) / Br;
  const int q0 = (p.causal ? n_qtiles - 1 - static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.y)) * Br;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long head = b * p.stride_b + h * p.stride_h, ld = p.stride_t;
  const E* Q = static_cast<const E*>(p.q) + head;
  const E* K = static_cast<const E*>(p.k) + head;
  const E* V = static_cast<const E*>(p.v) + head;
  const E* dO = static_cast<const E*>(p.dout) + b * p.o_stride_b + h * p.o_stride_h;   // dO's own layout
  const long long ldo = p.o_stride_t;
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

  load_tile<E, Br, D, kThreads>(Qs, Q, ld, q0, T, dreal);
  load_tile<E, Br, D, kThreads>(dOs, dO, ldo, q0, T, dreal);
  load_tile<E, Bc, D, kThreads>(Ks, K, ld, 0, T, dreal);
  load_tile<E, Bc, D, kThreads>(Vs, V, ld, 0, T, dreal);
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
      load_tile<E, Bc, D, kThreads>(Ks + nb * Bc * LD, K, ld, (j + 1) * Bc, T, dreal);
      load_tile<E, Bc, D, kThreads>(Vs + nb * Bc * LD, V, ld, (j + 1) * Bc, T, dreal);
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
          if (d * 8 < dreal)   // padded columns are not part of dQ
            *reinterpret_cast<std::uint32_t*>(dQ + row * ld + d * 8 + 2 * t) =
                pack2<E>(dq[mt][d][2 * hr] * p.scale, dq[mt][d][2 * hr + 1] * p.scale);
      }
    }
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

template <class E>
void launch_dim(const Params& p, cudaStream_t stream) {
  // <E, D, kWarps, Bc, MT>: Br = 16*MT*kWarps queries per block, Bc keys per step.
  switch (padded_head_dim(p.head_dim)) {
    case 16: return launch_dq<E, 16, 4, 64, 2>(p, stream);
    case 32: return launch_dq<E, 32, 4, 32, 2>(p, stream);
    case 64: return launch_dq<E, 64, 4, 32, 2>(p, stream);
    case 128: return launch_dq<E, 128, 4, 32, 1>(p, stream);
    default: throw_unsupported_head_dim(p.head_dim);
  }
}

}  // namespace

void launch_flash_bwd_dq_deterministic(const Params& p, Elem e, cudaStream_t stream) {
  if (e == Elem::bf16) return launch_dim<__nv_bfloat16>(p, stream);
  if (e == Elem::f16) return launch_dim<__half>(p, stream);
  throw_error("flash attention backward (tensor cores): bf16 or fp16 only");
}

}  // namespace lmscale::ops::cuda::attn
