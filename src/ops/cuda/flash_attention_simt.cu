// FlashAttention-2 on CUDA cores (fp32 FMAs), the path for fp32 inputs and for 16-bit inputs
// whose layout the tensor-core kernels cannot take (rows not 16-byte aligned). Same algorithm as
// the tensor-core kernels, one row per G consecutive lanes: each lane owns DP = D/G of the head
// dimensions, dot products are summed across the G lanes with shuffles, and the online softmax
// runs per key. Tiles of the other operand are staged in shared memory as fp32, each lane's slice
// padded by one word so the G slices of a row fall in different banks.
// Head dims: compiled for padded widths D (16, 32, 64, 128, 256: few widths keep the compile time
// down on this slower path), run for any real head dim p.head_dim <= D: dimensions past it are
// zeros in registers and shared memory (they add nothing to the dot products) and are never stored.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "attention_kernels.h"
#include "attention_mma.cuh"

namespace lmscale::ops::cuda::attn {

namespace {

constexpr int kThreads = 128;

// Padded widths and lanes per row: G a power of two (shuffle reductions) with D / G <= 32 dims per
// lane (registers: the dK/dV kernel keeps 4 x DP floats per lane).
template <int D>
struct Simt {
  static constexpr int G = D <= 32 ? 1 : D / 32;   // lanes per row: 1, 1, 2, 4, 8
  static constexpr int DP = D / G;                                          // dims per lane
  static_assert(DP * G == D && DP <= 32, "padded SIMT width");
  // Rows of the streamed operand per shared-memory tile: two fp32 tiles of kTile x LDS stay under
  // the 48 KB of static shared memory (32 rows x 264 x 4 B x 2 = 68 KB would not at D = 256).
  static constexpr int kTile = D <= 128 ? 32 : 16;
  static constexpr int R = kThreads / G;           // rows per block
  static constexpr int LDS = D + G;                // padded shared row: slice p starts at p*(DP+1)
  __device__ static int col(int c) { return c + c / DP; }
};

template <int G>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int w = 1; w < G; w <<= 1) x += __shfl_xor_sync(0xffffffffu, x, w);
  return x;
}

// Stages rows [r0, r0 + kTile) of `src` (one head) as fp32 into `dst` (padded rows); zeros past
// `rows` and in columns at or past the real head dim `dreal`.
template <class E, int D>
__device__ __forceinline__ void stage(float* dst, const E* src, long long ld, int r0, int rows, int dreal) {
  constexpr int kTile = Simt<D>::kTile;
  for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    dst[r * Simt<D>::LDS + Simt<D>::col(c)] = r0 + r < rows && c < dreal ? to_float(src[(r0 + r) * ld + c]) : 0.f;
  }
}

template <class E, int D>
__global__ void __launch_bounds__(kThreads) flash_fwd_simt_kernel(const Params p) {
  using S = Simt<D>;
  constexpr int kTile = S::kTile;
  __shared__ float Ks[kTile * S::LDS], Vs[kTile * S::LDS];
  const int T = p.seq, dreal = p.head_dim;
  const int n_qtiles = (T + S::R - 1) / S::R;
  const int q0 = (p.causal ? n_qtiles - 1 - static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.y)) * S::R;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long head = b * p.stride_b + h * p.stride_h, ld = p.stride_t;
  const int row = q0 + static_cast<int>(threadIdx.x) / S::G, part = threadIdx.x % S::G, e0 = part * S::DP;
  const float sl2 = p.scale * kLog2e;
  const E* Q = static_cast<const E*>(p.q) + head;
  float q[S::DP], acc[S::DP];
#pragma unroll
  for (int e = 0; e < S::DP; ++e) {
    q[e] = row < T && e0 + e < dreal ? to_float(Q[row * ld + e0 + e]) * sl2 : 0.f;   // scores in log2 units
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int kv_end = p.causal ? min(T, q0 + S::R) : T;
  for (int k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();
    stage<E, D>(Ks, static_cast<const E*>(p.k) + head, ld, k0, T, dreal);
    stage<E, D>(Vs, static_cast<const E*>(p.v) + head, ld, k0, T, dreal);
    __syncthreads();
    const int nk = min(kTile, kv_end - k0);
    for (int jj = 0; jj < nk; ++jj) {
      const float* kr = Ks + jj * S::LDS + part * (S::DP + 1);
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < S::DP; ++e) dot += q[e] * kr[e];
      dot = group_sum<S::G>(dot);
      if (p.causal && k0 + jj > row) continue;
      const float m_new = fmaxf(m, dot), alpha = exp2f(m - m_new), pv = exp2f(dot - m_new);
      l = l * alpha + pv;
      m = m_new;
      const float* vr = Vs + jj * S::LDS + part * (S::DP + 1);
#pragma unroll
      for (int e = 0; e < S::DP; ++e) acc[e] = acc[e] * alpha + pv * vr[e];
    }
  }
  if (row < T) {
    E* O = static_cast<E*>(p.out) + b * p.o_stride_b + h * p.o_stride_h;   // o's own layout
    const float inv = 1.f / l;
#pragma unroll
    for (int e = 0; e < S::DP; ++e)
      if (e0 + e < dreal) O[row * p.o_stride_t + e0 + e] = from_float<E>(acc[e] * inv);
    if (part == 0) p.lse[static_cast<long long>(bh) * T + row] = (m + log2f(l)) * kLn2;
  }
}

// dQ: one row (query) per G lanes, key tiles streamed.
template <class E, int D>
__global__ void __launch_bounds__(kThreads) flash_bwd_dq_simt_kernel(const Params p) {
  using S = Simt<D>;
  constexpr int kTile = S::kTile;
  __shared__ float Ks[kTile * S::LDS], Vs[kTile * S::LDS];
  const int T = p.seq, dreal = p.head_dim;
  const int n_qtiles = (T + S::R - 1) / S::R;
  const int q0 = (p.causal ? n_qtiles - 1 - static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.y)) * S::R;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long head = b * p.stride_b + h * p.stride_h, ld = p.stride_t;
  const int row = q0 + static_cast<int>(threadIdx.x) / S::G, part = threadIdx.x % S::G, e0 = part * S::DP;
  const float sl2 = p.scale * kLog2e;
  const E* Q = static_cast<const E*>(p.q) + head;
  const E* dO = static_cast<const E*>(p.dout) + b * p.o_stride_b + h * p.o_stride_h;   // dO's own layout
  const bool live = row < T;
  const float L = live ? p.lse[static_cast<long long>(bh) * T + row] * kLog2e : 0.f;
  const float Drow = live ? p.dsum[static_cast<long long>(bh) * T + row] : 0.f;
  float q[S::DP], dov[S::DP], dq[S::DP];
#pragma unroll
  for (int e = 0; e < S::DP; ++e) {
    q[e] = live && e0 + e < dreal ? to_float(Q[row * ld + e0 + e]) : 0.f;
    dov[e] = live && e0 + e < dreal ? to_float(dO[row * p.o_stride_t + e0 + e]) : 0.f;
    dq[e] = 0.f;
  }
  const int kv_end = p.causal ? min(T, q0 + S::R) : T;
  for (int k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();
    stage<E, D>(Ks, static_cast<const E*>(p.k) + head, ld, k0, T, dreal);
    stage<E, D>(Vs, static_cast<const E*>(p.v) + head, ld, k0, T, dreal);
    __syncthreads();
    const int nk = min(kTile, kv_end - k0);
    for (int jj = 0; jj < nk; ++jj) {
      const float* kr = Ks + jj * S::LDS + part * (S::DP + 1);
      const float* vr = Vs + jj * S::LDS + part * (S::DP + 1);
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int e = 0; e < S::DP; ++e) {
        s += q[e] * kr[e];
        dp += dov[e] * vr[e];
      }
      s = group_sum<S::G>(s);
      dp = group_sum<S::G>(dp);
      if (!live || (p.causal && k0 + jj > row)) continue;
      const float ds = exp2f(s * sl2 - L) * (dp - Drow);
#pragma unroll
      for (int e = 0; e < S::DP; ++e) dq[e] += ds * kr[e];
    }
  }
  if (live) {
    E* dQ = static_cast<E*>(p.dq) + head;
#pragma unroll
    for (int e = 0; e < S::DP; ++e)
      if (e0 + e < dreal) dQ[row * ld + e0 + e] = from_float<E>(dq[e] * p.scale);
  }
}

// dK, dV: one row (key) per G lanes, query tiles streamed (with their lse and D).
template <class E, int D>
__global__ void __launch_bounds__(kThreads) flash_bwd_dkdv_simt_kernel(const Params p) {
  using S = Simt<D>;
  constexpr int kTile = S::kTile;
  __shared__ float Qs[kTile * S::LDS], dOs[kTile * S::LDS], Ls[kTile], Ds[kTile];
  const int T = p.seq, dreal = p.head_dim;
  const int k0 = static_cast<int>(blockIdx.y) * S::R;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const long long head = b * p.stride_b + h * p.stride_h, ld = p.stride_t;
  const int key = k0 + static_cast<int>(threadIdx.x) / S::G, part = threadIdx.x % S::G, e0 = part * S::DP;
  const float sl2 = p.scale * kLog2e;
  const bool live = key < T;
  const E* K = static_cast<const E*>(p.k) + head;
  const E* V = static_cast<const E*>(p.v) + head;
  float kv[S::DP], vv[S::DP], dk[S::DP], dv[S::DP];
#pragma unroll
  for (int e = 0; e < S::DP; ++e) {
    kv[e] = live && e0 + e < dreal ? to_float(K[key * ld + e0 + e]) : 0.f;
    vv[e] = live && e0 + e < dreal ? to_float(V[key * ld + e0 + e]) : 0.f;
    dk[e] = dv[e] = 0.f;
  }
  const float* lse = p.lse + static_cast<long long>(bh) * T;
  const float* dsum = p.dsum + static_cast<long long>(bh) * T;
  const int q_begin = p.causal ? k0 : 0;
  for (int qs0 = q_begin; qs0 < T; qs0 += kTile) {
    __syncthreads();
    stage<E, D>(Qs, static_cast<const E*>(p.q) + head, ld, qs0, T, dreal);
    stage<E, D>(dOs, static_cast<const E*>(p.dout) + b * p.o_stride_b + h * p.o_stride_h, p.o_stride_t, qs0, T,
                dreal);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      Ls[r] = qs0 + r < T ? lse[qs0 + r] * kLog2e : INFINITY;
      Ds[r] = qs0 + r < T ? dsum[qs0 + r] : 0.f;
    }
    __syncthreads();
    const int nq = min(kTile, T - qs0);
    for (int ii = 0; ii < nq; ++ii) {
      const float* qr = Qs + ii * S::LDS + part * (S::DP + 1);
      const float* dr = dOs + ii * S::LDS + part * (S::DP + 1);
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int e = 0; e < S::DP; ++e) {
        s += kv[e] * qr[e];
        dp += vv[e] * dr[e];
      }
      s = group_sum<S::G>(s);
      dp = group_sum<S::G>(dp);
      if (!live || (p.causal && key > qs0 + ii)) continue;
      const float pv = exp2f(s * sl2 - Ls[ii]);
      const float ds = pv * (dp - Ds[ii]);
#pragma unroll
      for (int e = 0; e < S::DP; ++e) {
        dv[e] += pv * dr[e];
        dk[e] += ds * qr[e];
      }
    }
  }
  if (live) {
    E* dK = static_cast<E*>(p.dk) + head;
    E* dV = static_cast<E*>(p.dv) + head;
#pragma unroll
    for (int e = 0; e < S::DP; ++e) {
      if (e0 + e >= dreal) continue;   // padded dimensions
      dK[key * ld + e0 + e] = from_float<E>(dk[e] * p.scale);
      dV[key * ld + e0 + e] = from_float<E>(dv[e]);
    }
  }
}

template <class E, int D>
void launch_fwd(const Params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq + Simt<D>::R - 1) / Simt<D>::R));
  flash_fwd_simt_kernel<E, D><<<grid, kThreads, 0, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

template <class E, int D>
void launch_bwd(const Params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.batch * p.heads), static_cast<unsigned>((p.seq + Simt<D>::R - 1) / Simt<D>::R));
  flash_bwd_dkdv_simt_kernel<E, D><<<grid, kThreads, 0, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
  flash_bwd_dq_simt_kernel<E, D><<<grid, kThreads, 0, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

template <class E>
void dispatch(const Params& p, cudaStream_t stream, bool backward) {
  const int d = p.head_dim;
  if (d < 1 || d > kMaxFlashHeadDim) throw_unsupported_head_dim(d);
  if (d <= 16) return backward ? launch_bwd<E, 16>(p, stream) : launch_fwd<E, 16>(p, stream);
  if (d <= 32) return backward ? launch_bwd<E, 32>(p, stream) : launch_fwd<E, 32>(p, stream);
  if (d <= 64) return backward ? launch_bwd<E, 64>(p, stream) : launch_fwd<E, 64>(p, stream);
  if (d <= 128) return backward ? launch_bwd<E, 128>(p, stream) : launch_fwd<E, 128>(p, stream);
  return backward ? launch_bwd<E, 256>(p, stream) : launch_fwd<E, 256>(p, stream);
}

}  // namespace

void launch_flash_fwd_simt(const Params& p, Elem e, cudaStream_t stream) {
  if (e == Elem::f32) return dispatch<float>(p, stream, false);
  if (e == Elem::bf16) return dispatch<__nv_bfloat16>(p, stream, false);
  return dispatch<__half>(p, stream, false);
}

void launch_flash_bwd_simt(const Params& p, Elem e, cudaStream_t stream) {
  if (e == Elem::f32) return dispatch<float>(p, stream, true);
  if (e == Elem::bf16) return dispatch<__nv_bfloat16>(p, stream, true);
  return dispatch<__half>(p, stream, true);
}

}  // namespace lmscale::ops::cuda::attn
