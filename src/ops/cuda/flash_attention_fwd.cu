// FlashAttention-2 forward on tensor cores (bf16/fp16 in, fp32 accumulate), Algorithm 1 of Dao
// (2023). One block = Br = 16*kWarps query rows of one (batch, head); each warp owns 16 rows and
// keeps its Q fragments, the unnormalised output O[16, D] and the running max m and sum l in
// registers. Key/value tiles of Bc rows stream through shared memory, double-buffered with
// cp.async so the next tile loads while this one is multiplied:
//   S = Q K^T (mma, fp32)  ->  masked, scaled to log2 units  ->  m_new = max(m, rowmax S)
//   P = exp2(S - m_new), l = l*exp2(m - m_new) + rowsum P, O = O*exp2(m - m_new) + P V (mma)
// and at the end O /= l, lse = (m + log2 l) * ln 2. Causal: key tiles past the block's last row
// are never loaded; only tiles crossing the diagonal (or the sequence end) are masked; blocks
// with the most key tiles are scheduled first (grid.y reversed).
// Head dims: the kernel is compiled for a padded width DP (a multiple of 16 up to 128, of 32 up to
// 256) and runs any real D = p.head_dim <= DP that is a multiple of 8: Q/K/V columns D..DP-1 are
// zero-filled in shared memory (they add nothing to Q K^T; P V gives zeros there) and never stored.
// kQSmem (large DP): Q fragments are re-read from shared memory for every key tile instead of
// living in registers, which leaves room for the DP/2 fp32 output accumulators per thread.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_kernels.h"
#include "attention_mma.cuh"

namespace lmscale::ops::cuda::attn {

namespace {

template <class E, int D, int kWarps, int Bc, int MT, bool kQSmem>
__global__ void __launch_bounds__(kWarps * 32) flash_fwd_mma_kernel(const Params p) {
  // D is the padded width (template), dreal the head dim of this call (multiple of 8, <= D).
  constexpr int Br = 16 * MT * kWarps, kThreads = kWarps * 32, LD = D + 8;
  const int dreal = p.head_dim;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* Qs = reinterpret_cast<E*>(smem_raw);   // [Br][LD]
  E* Ks = Qs + Br * LD;                     // [2][Bc][LD]
  E* Vs = Ks + 2 * Bc * LD;                 // [2][Bc][LD]

  const int T = p.seq;
  const int n_qtiles = (T + Br - 1) / Br;
  const int q0 = (p.causal ? n_qtiles - 1 - static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.y)) * Br;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long head = b * p.stride_b + h * p.stride_h, ld = p.stride_t;
  const E* Q = static_cast<const E*>(p.q) + head;
  const E* K = static_cast<const E*>(p.k) + head;
  const E* V = static_cast<const E*>(p.v) + head;
  E* O = static_cast<E*>(p.out) + b * p.o_stride_b + h * p.o_stride_h;   // o's own layout
  const long long ldo = p.o_stride_t;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow0 = warp * 16 * MT;            // first row of this warp in the tile
  const int row0 = q0 + wrow0 + g;             // rows row0 + 16*mt (+8)

  const int kv_end = p.causal ? min(T, q0 + Br) : T;
  const int n_ktiles = (kv_end + Bc - 1) / Bc;

  load_tile<E, Br, D, kThreads>(Qs, Q, ld, q0, T, dreal);
  load_tile<E, Bc, D, kThreads>(Ks, K, ld, 0, T, dreal);
  load_tile<E, Bc, D, kThreads>(Vs, V, ld, 0, T, dreal);
  cp_async_commit();

  std::uint32_t qf[kQSmem ? 1 : MT][kQSmem ? 1 : D / 16][4];
  float oacc[MT][D / 8][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) oacc[mt][d][0] = oacc[mt][d][1] = oacc[mt][d][2] = oacc[mt][d][3] = 0.f;
  }
  const float sl2 = p.scale * kLog2e;

  for (int j = 0; j < n_ktiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();   // tile j visible to all; everyone is done with tile j-1's buffer
    if (j + 1 < n_ktiles) {
      const int nb = (j + 1) & 1;
      load_tile<E, Bc, D, kThreads>(Ks + nb * Bc * LD, K, ld, (j + 1) * Bc, T, dreal);
      load_tile<E, Bc, D, kThreads>(Vs + nb * Bc * LD, V, ld, (j + 1) * Bc, T, dreal);
      cp_async_commit();
    }
    if constexpr (!kQSmem) {
      if (j == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) load_a(qf[mt][kk], Qs, LD, wrow0 + mt * 16, kk * 16);
      }
    }
    const E* Kt = Ks + (j & 1) * Bc * LD;
    const E* Vt = Vs + (j & 1) * Bc * LD;

    // S = Q K^T   [16*MT rows x Bc keys] per warp; each K fragment feeds MT row blocks.
    float s[MT][Bc / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < Bc / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t qa[MT][4];   // this k-slice's Q fragments
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kQSmem) {
          load_a(qa[mt], Qs, LD, wrow0 + mt * 16, kk * 16);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[mt][i] = qf[mt][kk][i];
        }
      }
#pragma unroll
      for (int nb = 0; nb < Bc / 16; ++nb) {
        std::uint32_t bf[4];
        load_b_nk(bf, Kt, LD, nb * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<E>(s[mt][2 * nb], qa[mt], bf);
          mma16816<E>(s[mt][2 * nb + 1], qa[mt], bf + 2);
        }
      }
    }
    // Mask keys past the end and, causal, keys after the query (only on tiles that need it).
    const int k0 = j * Bc;
    if ((k0 + Bc > T) || (p.causal && k0 + Bc - 1 > q0)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int key = k0 + n * 8 + 2 * t + (i & 1), row = row0 + mt * 16 + (i >> 1) * 8;
            if (key >= T || (p.causal && key > row)) s[mt][n][i] = -INFINITY;
          }
    }
    // Online softmax in log2 units: m_new = max(m, rowmax S * c), P = exp2(S * c - m_new).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {   // row g (hr = 0) and row g + 8 (hr = 1)
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < Bc / 8; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * hr], s[mt][n][2 * hr + 1]));
        mx = fmaxf(m[mt][hr], quad_max(mx) * sl2);
        const float base = mx == -INFINITY ? 0.f : mx;
        const float alpha = exp2f(m[mt][hr] - base);
        m[mt][hr] = mx;
        float rs = 0.f;
#pragma unroll
        for (int n = 0; n < Bc / 8; ++n) {
          s[mt][n][2 * hr] = exp2f(fmaf(s[mt][n][2 * hr], sl2, -base));
          s[mt][n][2 * hr + 1] = exp2f(fmaf(s[mt][n][2 * hr + 1], sl2, -base));
          rs += s[mt][n][2 * hr] + s[mt][n][2 * hr + 1];
        }
        l[mt][hr] = l[mt][hr] * alpha + rs;   // per-thread partial sums; the quad is summed at the end
#pragma unroll
        for (int d = 0; d < D / 8; ++d) {
          oacc[mt][d][2 * hr] *= alpha;
          oacc[mt][d][2 * hr + 1] *= alpha;
        }
      }
    }
    // O += P V: the S accumulators are exactly the A fragments of P (rounded to E); each V
    // fragment feeds MT row blocks.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      std::uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack2<E>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<E>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<E>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<E>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        std::uint32_t bf[4];
        load_b_kn(bf, Vt, LD, kk * 16, nd * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<E>(oacc[mt][2 * nd], pa[mt], bf);
          mma16816<E>(oacc[mt][2 * nd + 1], pa[mt], bf + 2);
        }
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = row0 + mt * 16 + hr * 8;
      const float lsum = quad_sum(l[mt][hr]);
      const float inv = 1.f / lsum;
      if (row < T) {
#pragma unroll
        for (int d = 0; d < D / 8; ++d)
          if (d * 8 < dreal)   // padded columns are not part of O
            *reinterpret_cast<std::uint32_t*>(O + row * ldo + d * 8 + 2 * t) =
                pack2<E>(oacc[mt][d][2 * hr] * inv, oacc[mt][d][2 * hr + 1] * inv);
        if (t == 0) p.lse[static_cast<long long>(bh) * T + row] = (m[mt][hr] + log2f(lsum)) * kLn2;
      }
    }
  }
}

template <class E, int D, int kWarps, int Bc, int MT, bool kQSmem = false>
void launch(const Params& p, cudaStream_t stream) {
  constexpr int Br = 16 * MT * kWarps;
  const std::size_t smem = static_cast<std::size_t>(Br + 4 * Bc) * (D + 8) * sizeof(E);
  auto kernel = flash_fwd_mma_kernel<E, D, kWarps, Bc, MT, kQSmem>;
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

// Tile shape per padded head dim, <kWarps, Bc, MT(, kQSmem)>: Br = 16*MT*kWarps query rows per
// block, Bc keys per shared-memory tile. Registers per thread grow as D/4 (Q fragments, unless
// kQSmem) + D/2*MT (O accumulators) + Bc/2*MT (scores); shapes were chosen so that ptxas reports
// no spills (docs/attention.md lists registers and shared memory per shape).
template <class E>
void launch_dim(const Params& p, cudaStream_t stream, int /*variant: none left (docs/attention.md)*/) {
  switch (padded_head_dim(p.head_dim)) {
    case 16: return launch<E, 16, 4, 64, 2>(p, stream);
    case 32: return launch<E, 32, 4, 32, 2>(p, stream);
    case 48: return launch<E, 48, 4, 64, 2>(p, stream);
    case 64: return launch<E, 64, 4, 64, 2>(p, stream);
    case 80: return launch<E, 80, 4, 64, 2>(p, stream);   // 2.7B preset; shapes tried: docs/attention.md
    case 96: return launch<E, 96, 4, 32, 2>(p, stream);
    case 112: return launch<E, 112, 4, 64, 1>(p, stream);
    case 128: return launch<E, 128, 4, 64, 1>(p, stream);
    case 160: return launch<E, 160, 4, 32, 1>(p, stream);
    case 192: return launch<E, 192, 4, 32, 1, true>(p, stream);
    case 224: return launch<E, 224, 4, 32, 1, true>(p, stream);
    case 256: return launch<E, 256, 4, 32, 1, true>(p, stream);
    default: throw_unsupported_head_dim(p.head_dim);
  }
}

}  // namespace

void launch_flash_fwd_mma_variant(const Params& p, Elem e, cudaStream_t stream, int variant) {
  if (e == Elem::bf16) return launch_dim<__nv_bfloat16>(p, stream, variant);
  if (e == Elem::f16) return launch_dim<__half>(p, stream, variant);
  throw_error("flash attention (tensor cores): bf16 or fp16 only");
}

void launch_flash_fwd_mma(const Params& p, Elem e, cudaStream_t stream) { launch_flash_fwd_mma_variant(p, e, stream, 0); }

}  // namespace lmscale::ops::cuda::attn
