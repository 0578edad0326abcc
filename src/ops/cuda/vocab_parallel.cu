// Vocabulary-parallel embedding and cross-entropy on CUDA (include/lmscale/ops/vocab_parallel.h).
// Embedding: a gather with the rank's id offset, zero rows for ids of other ranks; its backward
// shifts the ids into the local range (others become -1, which ops::embedding_backward's sorted,
// deterministic kernel skips) and reuses that kernel.
// Cross-entropy: one block per row of the local logits [N, Vl] in each of the three steps (max;
// sum of exp and the target logit; loss and gradient), fp32 statistics, vectorised when Vl is a
// multiple of 8 and the rows are 16-byte aligned. Per-row losses go to an fp32 buffer summed in a
// fixed order by a second launch (deterministic), as in ops::cross_entropy.
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 512;

template <bool kVec, class T>
__global__ void embedding_shard_kernel(const int* __restrict__ ids, const T* __restrict__ table, T* __restrict__ out,
                                       std::int64_t N, int d, int Vl, std::int64_t vocab_begin) {
  const std::int64_t per_row = kVec ? d / kChunk : d;
  const std::int64_t total = N * per_row;
  for (std::int64_t i = thread_index(); i < total; i += thread_stride()) {
    const std::int64_t n = i / per_row, j = i % per_row;
    const std::int64_t local = ids[n] - vocab_begin;
    const bool mine = local >= 0 && local < Vl;
    if constexpr (kVec) {
      float v[kChunk];
      if (mine) load_chunk(table + local * d + j * kChunk, v);
      else
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[e] = 0.f;
      store_chunk(out + n * d + j * kChunk, v);
    } else {
      out[n * d + j] = mine ? table[local * d + j] : from_f32<T>(0.f);
    }
  }
}

__global__ void shift_ids_kernel(const int* __restrict__ ids, int* __restrict__ local, std::int64_t N, int Vl,
                                 std::int64_t vocab_begin) {
  for (std::int64_t i = thread_index(); i < N; i += thread_stride()) {
    const std::int64_t l = ids[i] - vocab_begin;
    local[i] = l >= 0 && l < Vl ? static_cast<int>(l) : -1;
  }
}

// Calls body(c, v) for each element (vectorised: chunks of kChunk starting at c) of the row.
template <bool kVec, class T, class F>
__device__ __forceinline__ void for_row(const T* x, int Vl, F&& body) {
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < Vl; c += blockDim.x * kChunk) {
      float v[kChunk];
      load_chunk(x + c, v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) body(c + e, v[e]);
    }
  } else {
    for (int c = threadIdx.x; c < Vl; c += blockDim.x) body(c, to_f32(x[c]));
  }
}

template <bool kVec, class T>
__global__ void row_max_kernel(const T* __restrict__ logits, float* __restrict__ row_max, int Vl) {
  __shared__ float scratch[32];
  const T* x = logits + static_cast<std::int64_t>(blockIdx.x) * Vl;
  float m = -INFINITY;
  for_row<kVec>(x, Vl, [&](int, float v) { m = fmaxf(m, v); });
  m = block_max(m, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <bool kVec, class T>
__global__ void row_sums_kernel(const T* __restrict__ logits, const int* __restrict__ targets,
                                const float* __restrict__ row_max, float* __restrict__ sums, int Vl,
                                std::int64_t vocab_begin) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * Vl;
  const float m = row_max[row];
  float s = 0.f;
  for_row<kVec>(x, Vl, [&](int, float v) { s += __expf(v - m); });
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const std::int64_t local = targets[row] - vocab_begin;
    sums[2 * row] = s;
    sums[2 * row + 1] = local >= 0 && local < Vl ? to_f32(x[local]) : 0.f;
  }
}

template <bool kVec, class T>
__global__ void loss_kernel(const T* logits, const int* __restrict__ targets, const float* __restrict__ row_max,
                            const float* __restrict__ sums, float* __restrict__ row_loss, T* dlogits, int Vl,
                            std::int64_t vocab_begin, float grad_scale) {
  // logits and dlogits may alias: every element is read by the thread that writes it.
  const std::int64_t row = blockIdx.x;
  const float lse = row_max[row] + __logf(sums[2 * row]);
  if (threadIdx.x == 0) row_loss[row] = lse - sums[2 * row + 1];
  if (dlogits == nullptr) return;
  const T* x = logits + row * Vl;
  T* g = dlogits + row * Vl;
  const std::int64_t target = targets[row] - vocab_begin;   // outside [0, Vl): not on this rank
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < Vl; c += blockDim.x * kChunk) {
      float v[kChunk];
      load_chunk(x + c, v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[e] = (__expf(v[e] - lse) - (c + e == target ? 1.f : 0.f)) * grad_scale;
      store_chunk(g + c, v);
    }
  } else {
    for (int c = threadIdx.x; c < Vl; c += blockDim.x)
      g[c] = from_f32<T>((__expf(to_f32(x[c]) - lse) - (c == target ? 1.f : 0.f)) * grad_scale);
  }
}

__global__ void sum_rows_kernel(const float* __restrict__ row_loss, std::int64_t n, float* __restrict__ out) {
  __shared__ float scratch[32];
  float acc = 0.f;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += row_loss[i];
  const float total = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = total;
}

void check_stats(const char* op, const Tensor& t) {
  LMSCALE_CHECK(t.dtype() == DType::f32, "{}: statistics are fp32 on CUDA, got {}", op, dtype_name(t.dtype()));
}

bool vectorised(const Tensor& logits, const Tensor* dlogits) {
  return logits.dim(-1) % kChunk == 0 && is_aligned16(logits.data()) && (!dlogits || is_aligned16(dlogits->data()));
}

}  // namespace

void embedding_shard(Context& ctx, const Tensor& ids, const Tensor& table, std::int64_t vocab_begin, Tensor& out) {
  const std::int64_t Vl = table.dim(0), d = table.dim(-1), N = ids.numel();
  LMSCALE_CHECK(d <= 0x7fffffff && Vl <= 0x7fffffff, "embedding_shard: table {} too large", shape_str(table.shape()));
  if (N == 0 || d == 0) return;
  Resources& r = resources(ctx);
  const bool vec = d % kChunk == 0 && is_aligned16(table.data()) && is_aligned16(out.data());
  const unsigned grid = grid_for(N * (vec ? d / kChunk : d), kThreads, r.num_sms);
  LMSCALE_CUDA_DISPATCH_FLOAT(table.dtype(), "embedding_shard", T, {
    auto kernel = vec ? embedding_shard_kernel<true, T> : embedding_shard_kernel<false, T>;
    kernel<<<grid, kThreads, 0, r.stream>>>(ids.data_as<const int>(), table.data_as<const T>(), out.data_as<T>(), N,
                                            static_cast<int>(d), static_cast<int>(Vl), vocab_begin);
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void embedding_shard_backward(Context& ctx, const Tensor& ids, const Tensor& dout, std::int64_t vocab_begin,
                              Tensor& dtable) {
  const std::int64_t Vl = dtable.dim(0), N = ids.numel();
  LMSCALE_CHECK(Vl <= 0x7fffffff, "embedding_shard_backward: table too large");
  if (N == 0) return;
  Resources& r = resources(ctx);
  Scratch local(ctx, static_cast<std::size_t>(N) * sizeof(int), "embedding_ids");
  shift_ids_kernel<<<grid_for(N, kThreads, r.num_sms), kThreads, 0, r.stream>>>(
      ids.data_as<const int>(), local.as<int>(), N, static_cast<int>(Vl), vocab_begin);
  LMSCALE_CUDA_CHECK_LAUNCH();
  // Stream-ordered: the backward's kernels run after the shift on the same stream.
  const Tensor local_ids = Tensor::view(local.as<int>(), {N}, DType::i32, Device::cuda);
  embedding_backward(ctx, local_ids, dout, dtable);
}

void vocab_parallel_max(Context& ctx, const Tensor& logits, Tensor& row_max) {
  check_stats("vocab_parallel_max", row_max);
  const std::int64_t Vl = logits.dim(-1), N = row_max.numel();
  LMSCALE_CHECK(Vl <= 0x7fffffff && N <= 0x7fffffff, "vocab_parallel_max: logits {} too large",
                shape_str(logits.shape()));
  if (N == 0) return;
  Resources& r = resources(ctx);
  const bool vec = vectorised(logits, nullptr);
  LMSCALE_CUDA_DISPATCH_FLOAT(logits.dtype(), "vocab_parallel_max", T, {
    auto kernel = vec ? row_max_kernel<true, T> : row_max_kernel<false, T>;
    kernel<<<static_cast<unsigned>(N), kRowThreads, 0, r.stream>>>(logits.data_as<const T>(), row_max.data_as<float>(),
                                                                    static_cast<int>(Vl));
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_sums(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, Tensor& sums) {
  check_stats("vocab_parallel_sums", row_max);
  const std::int64_t Vl = logits.dim(-1), N = row_max.numel();
  LMSCALE_CHECK(Vl <= 0x7fffffff && N <= 0x7fffffff, "vocab_parallel_sums: logits {} too large",
                shape_str(logits.shape()));
  if (N == 0) return;
  Resources& r = resources(ctx);
  const bool vec = vectorised(logits, nullptr);
  LMSCALE_CUDA_DISPATCH_FLOAT(logits.dtype(), "vocab_parallel_sums", T, {
    auto kernel = vec ? row_sums_kernel<true, T> : row_sums_kernel<false, T>;
    kernel<<<static_cast<unsigned>(N), kRowThreads, 0, r.stream>>>(logits.data_as<const T>(),
                                                                    targets.data_as<const int>(),
                                                                    row_max.data_as<const float>(),
                                                                    sums.data_as<float>(), static_cast<int>(Vl),
                                                                    vocab_begin);
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_loss(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, const Tensor& sums, Tensor& loss_sum, Tensor* dlogits,
                         double grad_scale) {
  check_stats("vocab_parallel_loss", row_max);
  check_stats("vocab_parallel_loss", loss_sum);
  const std::int64_t Vl = logits.dim(-1), N = row_max.numel();
  LMSCALE_CHECK(Vl <= 0x7fffffff && N <= 0x7fffffff, "vocab_parallel_loss: logits {} too large",
                shape_str(logits.shape()));
  Resources& r = resources(ctx);
  if (N == 0) {
    LMSCALE_CUDA_CHECK(cudaMemsetAsync(loss_sum.data(), 0, sizeof(float), r.stream));
    return;
  }
  Scratch row_loss(ctx, static_cast<std::size_t>(N) * sizeof(float), "cross_entropy_rows");
  const bool vec = vectorised(logits, dlogits);
  LMSCALE_CUDA_DISPATCH_FLOAT(logits.dtype(), "vocab_parallel_loss", T, {
    auto kernel = vec ? loss_kernel<true, T> : loss_kernel<false, T>;
    kernel<<<static_cast<unsigned>(N), kRowThreads, 0, r.stream>>>(
        logits.data_as<const T>(), targets.data_as<const int>(), row_max.data_as<const float>(),
        sums.data_as<const float>(), row_loss.as<float>(), dlogits ? dlogits->data_as<T>() : nullptr,
        static_cast<int>(Vl), vocab_begin, static_cast<float>(grad_scale));
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
  sum_rows_kernel<<<1, 1024, 0, r.stream>>>(row_loss.as<const float>(), N, loss_sum.data_as<float>());
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
