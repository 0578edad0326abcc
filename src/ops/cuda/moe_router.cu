// The mixture-of-experts router on CUDA (lmscale/ops/moe.h, docs/moe.md):
// softmax, top-k and gates (moe_route), the router losses and the router's
// backward. One warp per token row, lane l holding experts l, l+32, ... (E <=
// 1024). The arithmetic is the CPU reference's (src/ops/cpu/moe.cpp) in fp64,
// in the same order where the order is sequential there (the top-k, the gates'
// sums), so the fp32 probabilities and the chosen experts agree with it; sums
// over experts, and the balance loss's sums over tokens, use fixed trees (fp64,
// last-bit differences only).
#include <climits>

#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "moe_cuda.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block of the per-row kernels
constexpr int kMaxExperts = 1024;


// probs[n,:] = softmax(logits[n,:]), lse[n], then the top-k by repeated
// selection: each lane proposes its largest untaken probability (strictly
// larger replaces, scanning e upwards), and the warp keeps the larger value, of
// equal values the lower expert: the CPU's tie-break.
template <class T>
__global__ void route_kernel(const T* __restrict__ logits, float* __restrict__ probs, float* __restrict__ lse,
                             int* __restrict__ experts, float* __restrict__ gates, std::int64_t N, int E, int k) {
  const int lane = threadIdx.x & 31;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;  // the whole warp leaves together
  const T* z = logits + n * E;
  float* p = probs + n * E;
  double m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmax(m, static_cast<double>(to_f32(z[e])));
  m = warp_max(m);
  double s = 0;
  for (int e = lane; e < E; e += 32) s += exp(static_cast<double>(to_f32(z[e])) - m);
  s = warp_sum(s);
  if (lane == 0) lse[n] = static_cast<float>(m + log(s));
  for (int e = lane; e < E; e += 32) p[e] = static_cast<float>(exp(static_cast<double>(to_f32(z[e])) - m) / s);
  unsigned taken = 0;  // bit i: expert lane + 32 i is chosen
  double sum = 0;
  int* ex = experts + n * k;
  for (int j = 0; j < k; ++j) {
    float best_v = -INFINITY;
    int best_e = INT_MAX;
    for (int e = lane, i = 0; e < E; e += 32, ++i)
      if (!((taken >> i) & 1u) && (best_e == INT_MAX || p[e] > best_v)) {
        best_v = p[e];
        best_e = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      const bool other_valid = oe != INT_MAX, mine_valid = best_e != INT_MAX;
      if ((other_valid && !mine_valid) || (other_valid && (ov > best_v || (ov == best_v && oe < best_e)))) {
        best_v = ov;
        best_e = oe;
      }
    }
    if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
    if (lane == 0) ex[j] = best_e;
    sum += static_cast<double>(best_v);
  }
  __syncwarp();
  for (int j = lane; j < k; j += 32) gates[n * k + j] = static_cast<float>(static_cast<double>(p[ex[j]]) / sum);
}

// counts[b,e] = assignments of sequence b (rows b T .. b T + T-1) to expert e:
// one block per sequence, a shared histogram (integer atomics: the counts do
// not depend on their order).
__global__ void sequence_counts_kernel(const int* __restrict__ experts, std::int64_t T, int k, int E,
                                       int* __restrict__ counts) {
  extern __shared__ int hist[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const std::int64_t a0 = static_cast<std::int64_t>(blockIdx.x) * T * k, a1 = a0 + T * k;
  for (std::int64_t i = a0 + threadIdx.x; i < a1; i += blockDim.x) {
    const int e = experts[i];
    if (e >= 0 && e < E) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[static_cast<std::int64_t>(blockIdx.x) * E + e] = hist[e];
}

// pc[b,e] = P_{b,e} c_{b,e}: block (e, b) sums expert e's probabilities over
// sequence b's T tokens (a strided fp64 sum per thread, then block_sum's fixed
// tree: the same bits every run). One block per (e, b) pair: a single
// block walking every pair's T tokens in order took 0.26 ms a layer on an H100.
// Blocks (E, b) sum sequence b's lse^2 the same way into pz[b], for the z-loss: one block
// over all B T tokens took 18 us a layer on an H200 (a kernel profile of moe-1b), waiting on
// its loads one after another.
__global__ void router_balance_kernel(const float* __restrict__ probs, const float* __restrict__ lse,
                                      const int* __restrict__ counts, std::int64_t T, int E, double* __restrict__ pc,
                                      double* __restrict__ pz) {
  __shared__ double partial[32];
  const int e = static_cast<int>(blockIdx.x);
  const std::int64_t b = blockIdx.y;
  double P = 0;
  if (e == E) {
    for (std::int64_t t = threadIdx.x; t < T; t += blockDim.x) P += static_cast<double>(lse[b * T + t]) * lse[b * T + t];
    P = block_sum(P, partial);
    if (threadIdx.x == 0) pz[b] = P;
    return;
  }
  for (std::int64_t t = threadIdx.x; t < T; t += blockDim.x) P += static_cast<double>(probs[(b * T + t) * E + e]);
  P = block_sum(P, partial);
  if (threadIdx.x == 0) pc[b * E + e] = P * static_cast<double>(counts[b * E + e]);
}

// One thread: the balance term (pc summed over e, then over sequences, in order)
// and the z-loss (pz summed over sequences, in order).
__global__ void router_terms_kernel(const double* __restrict__ pc, const double* __restrict__ pz, std::int64_t B,
                                    std::int64_t T, int E, int k, double aux_coef, double z_coef,
                                    float* __restrict__ terms) {
  double balance = 0, zs = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    double s = 0;
    for (int e = 0; e < E; ++e) s += pc[b * E + e];
    balance += static_cast<double>(E) / static_cast<double>(T * k) * s;
    zs += pz[b];
  }
  terms[0] = static_cast<float>(balance);
  terms[1] = static_cast<float>(zs);
  terms[2] = static_cast<float>(aux_coef * balance + z_coef * zs);
}

// dlogits[n,:] from the gates' gradient, the balance loss and the z-loss
// (formulas in moe.h).
template <class T>
__global__ void route_backward_kernel(const float* __restrict__ probs, const float* __restrict__ lse,
                                      const int* __restrict__ experts, const float* __restrict__ gates,
                                      const float* __restrict__ dgates, const int* __restrict__ counts, std::int64_t N,
                                      std::int64_t Tseq, int E, int k, double balance, double zcoef_scaled,
                                      T* __restrict__ dlogits) {
  const int lane = threadIdx.x & 31;
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const float* p = probs + n * E;
  const int* ex = experts + n * k;
  const int* c = counts + (n / Tseq) * E;
  double S = 0, dot = 0;  // gates g_j = p_{e_j} / S
  for (int j = 0; j < k; ++j) {
    S += static_cast<double>(p[ex[j]]);
    dot += static_cast<double>(dgates[n * k + j]) * static_cast<double>(gates[n * k + j]);
  }
  auto dp = [&](int e) {
    double v = balance * static_cast<double>(c[e]);
    for (int j = 0; j < k; ++j)
      if (ex[j] == e) v += (static_cast<double>(dgates[n * k + j]) - dot) / S;
    return v;
  };
  double pdp = 0;
  for (int e = lane; e < E; e += 32) pdp += static_cast<double>(p[e]) * dp(e);
  pdp = warp_sum(pdp);
  const double zterm = zcoef_scaled * 2.0 * static_cast<double>(lse[n]);
  for (int e = lane; e < E; e += 32) {
    const double pe = static_cast<double>(p[e]);
    dlogits[n * E + e] = from_f32<T>(static_cast<float>(pe * (dp(e) - pdp) + zterm * pe));
  }
}

void check_router(const char* op, std::int64_t E, const Tensor& stats) {
  LMSCALE_CHECK(E <= kMaxExperts, "{}: {} experts; the CUDA router handles at most {}", op, E, kMaxExperts);
  LMSCALE_CHECK(stats.dtype() == DType::f32, "{}: the router statistics must be fp32 on CUDA, got {}", op,
                dtype_name(stats.dtype()));
}

unsigned row_blocks(std::int64_t N) { return static_cast<unsigned>((N + kWarps - 1) / kWarps); }

// Per-sequence assignment counts [N/T, E] into a scratch buffer.
void sequence_counts(Context& ctx, const Tensor& experts, std::int64_t T, std::int64_t E, int* counts) {
  const std::int64_t N = experts.dim(0), k = experts.dim(1);
  sequence_counts_kernel<<<static_cast<unsigned>(N / T), 256, static_cast<std::size_t>(E) * sizeof(int), stream(ctx)>>>(
      experts.data_as<const int>(), T, static_cast<int>(k), static_cast<int>(E), counts);
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_route(Context& ctx, const Tensor& logits, Tensor& probs, Tensor& lse, Tensor& experts, Tensor& gates) {
  const std::int64_t N = logits.dim(0), E = logits.dim(1), k = experts.dim(1);
  check_router("ops::moe_route", E, probs);
  if (N == 0) return;
  LMSCALE_CUDA_DISPATCH_FLOAT(
      logits.dtype(), "ops::moe_route", T,
      route_kernel<T><<<row_blocks(N), kWarps * 32, 0, stream(ctx)>>>(
          logits.data_as<const T>(), probs.data_as<float>(), lse.data_as<float>(), experts.data_as<int>(),
          gates.data_as<float>(), N, static_cast<int>(E), static_cast<int>(k)));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void moe_router_losses(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts, std::int64_t T,
                       double aux_coef, double z_coef, Tensor& terms) {
  const std::int64_t N = probs.dim(0), E = probs.dim(1), k = experts.dim(1), B = N / T;
  check_router("ops::moe_router_losses", E, probs);
  if (N == 0) {
    fill(ctx, terms, 0.0);
    return;
  }
  Scratch counts(ctx, static_cast<std::size_t>(B * E) * sizeof(int), "moe_plan");
  Scratch pc(ctx, static_cast<std::size_t>(B * (E + 1)) * sizeof(double), "moe_plan");   // pc [B,E], then pz [B]
  sequence_counts(ctx, experts, T, E, counts.as<int>());
  LMSCALE_CHECK(B <= 65535, "ops::moe_router_losses: {} sequences; the CUDA router handles at most 65535", B);
  double* pz = pc.as<double>() + B * E;
  router_balance_kernel<<<dim3(static_cast<unsigned>(E + 1), static_cast<unsigned>(B)), 256, 0, stream(ctx)>>>(
      probs.data_as<const float>(), lse.data_as<const float>(), counts.as<const int>(), T, static_cast<int>(E),
      pc.as<double>(), pz);
  LMSCALE_CUDA_CHECK_LAUNCH();
  router_terms_kernel<<<1, 1, 0, stream(ctx)>>>(pc.as<const double>(), pz, B, T, static_cast<int>(E),
                                               static_cast<int>(k), aux_coef, z_coef, terms.data_as<float>());
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void moe_route_backward(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                        const Tensor& gates, const Tensor& dgates, std::int64_t T, double aux_coef, double z_coef,
                        double scale, Tensor& dlogits) {
  const std::int64_t N = probs.dim(0), E = probs.dim(1), k = experts.dim(1);
  check_router("ops::moe_route_backward", E, probs);
  if (N == 0) return;
  Scratch counts(ctx, static_cast<std::size_t>((N / T) * E) * sizeof(int), "moe_plan");
  sequence_counts(ctx, experts, T, E, counts.as<int>());
  const double balance = scale * aux_coef * static_cast<double>(E) / static_cast<double>(T * k);
  LMSCALE_CUDA_DISPATCH_FLOAT(
      dlogits.dtype(), "ops::moe_route_backward", V,
      route_backward_kernel<V><<<row_blocks(N), kWarps * 32, 0, stream(ctx)>>>(
          probs.data_as<const float>(), lse.data_as<const float>(), experts.data_as<const int>(),
          gates.data_as<const float>(), dgates.data_as<const float>(), counts.as<const int>(), N, T,
          static_cast<int>(E), static_cast<int>(k), balance, scale * z_coef, dlogits.data_as<V>()));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
