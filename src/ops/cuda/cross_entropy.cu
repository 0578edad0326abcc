// Cross-entropy fused with its gradient on CUDA. One block per row of logits [N, V]:
//   pass 1 reads the row once, keeping a running (max, sum of exp) per thread (online softmax),
//          reduced over the block to logsumexp;
//   pass 2 re-reads the row (from L2: the block just read it) and writes
//          dlogits = (softmax - onehot) * grad_scale in the logits' dtype, in place when dlogits
//          aliases logits.
// No fp32 copy of the logits is made. Each row's loss (lse - logit[target]) goes to an fp32
// buffer [N]; a second launch adds those in a fixed order into loss_sum (deterministic).
// A target outside [0, V) gives a NaN loss for its row (and NaN gradients), so a bad batch shows up
// in the loss instead of reading out of bounds.
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 512;

// Running (max m, sum s of exp(x - m)); merging rescales the smaller side.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ MaxSum block_merge(MaxSum v, float* sm, float* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  if (lane == 0) sm[warp] = v.m, ss[warp] = v.s;
  __syncthreads();
  v = lane < warps ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.f};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}

template <bool kVec, class T>
__global__ void cross_entropy_kernel(const T* logits, const int* __restrict__ targets, float* __restrict__ row_loss,
                                     T* dlogits, int V, float grad_scale) {
  // logits and dlogits may alias: every element is read (pass 2) by the thread that writes it.
  __shared__ float sm[32], ss[32];
  __shared__ float target_logit;
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  const int target = targets[row];
  const bool target_ok = target >= 0 && target < V;
  // Read before any thread writes the row (the barrier inside block_merge orders it).
  if (threadIdx.x == 0) target_logit = target_ok ? to_f32(x[target]) : NAN;

  MaxSum acc{-INFINITY, 0.f};
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < V; c += blockDim.x * kChunk) {
      float v[kChunk];
      load_chunk(x + c, v);
      float m = v[0];
#pragma unroll
      for (int e = 1; e < kChunk; ++e) m = fmaxf(m, v[e]);
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) s += __expf(v[e] - m);
      acc = merge(acc, {m, s});
    }
  } else {
    for (int c = threadIdx.x; c < V; c += blockDim.x) acc = merge(acc, {to_f32(x[c]), 1.f});
  }
  const MaxSum total = block_merge(acc, sm, ss);
  const float lse = total.m + __logf(total.s);
  if (threadIdx.x == 0) row_loss[row] = lse - target_logit;
  if (dlogits == nullptr) return;
  T* g = dlogits + row * V;
  const float bad = target_ok ? 0.f : NAN;
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < V; c += blockDim.x * kChunk) {
      float v[kChunk];
      load_chunk(x + c, v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[e] = (__expf(v[e] - lse) - (c + e == target ? 1.f : 0.f) + bad) * grad_scale;
      store_chunk(g + c, v);
    }
  } else {
    for (int c = threadIdx.x; c < V; c += blockDim.x)
      g[c] = from_f32<T>((__expf(to_f32(x[c]) - lse) - (c == target ? 1.f : 0.f) + bad) * grad_scale);
  }
}

// loss_sum = sum of row_loss[0..N) in a fixed order: each thread a strided partial, then the block.
__global__ void sum_rows_kernel(const float* __restrict__ row_loss, std::int64_t n, float* __restrict__ out) {
  __shared__ float scratch[32];
  float acc = 0.f;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += row_loss[i];
  const float total = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace

void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, Tensor& loss_sum, Tensor* dlogits,
                   double grad_scale) {
  const std::int64_t V = logits.dim(-1), N = V ? logits.numel() / V : 0;
  LMSCALE_CHECK(targets.dtype() == DType::i32 && targets.numel() == N, "cross_entropy: targets {} {} for {} rows",
                dtype_name(targets.dtype()), shape_str(targets.shape()), N);
  LMSCALE_CHECK(loss_sum.dtype() == DType::f32 && loss_sum.numel() == 1, "cross_entropy: loss_sum must be one fp32");
  LMSCALE_CHECK(!dlogits || (dlogits->dtype() == logits.dtype() && dlogits->numel() == logits.numel()),
                "cross_entropy: dlogits must match logits");
  LMSCALE_CHECK(V <= 0x7fffffff && N <= 0x7fffffff, "cross_entropy: logits {} too large", shape_str(logits.shape()));
  Resources& r = resources(ctx);
  if (N == 0) {
    LMSCALE_CUDA_CHECK(cudaMemsetAsync(loss_sum.data(), 0, sizeof(float), r.stream));
    return;
  }
  Scratch row_loss(ctx, static_cast<std::size_t>(N) * sizeof(float), "cross_entropy_rows");
  const bool vec = V % kChunk == 0 && is_aligned16(logits.data()) && (!dlogits || is_aligned16(dlogits->data()));
  LMSCALE_CUDA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", T, {
    auto kernel = vec ? cross_entropy_kernel<true, T> : cross_entropy_kernel<false, T>;
    kernel<<<static_cast<unsigned>(N), kThreads, 0, r.stream>>>(logits.data_as<const T>(), targets.data_as<const int>(),
                                                                 row_loss.as<float>(),
                                                                 dlogits ? dlogits->data_as<T>() : nullptr,
                                                                 static_cast<int>(V), static_cast<float>(grad_scale));
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
  sum_rows_kernel<<<1, 1024, 0, r.stream>>>(row_loss.as<const float>(), N, loss_sum.data_as<float>());
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
