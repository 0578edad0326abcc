// Token embedding on CUDA.
// Forward: out[n, :] = table[ids[n], :], a gather; the output dtype may differ from the table's
// (an fp32 table gathered straight into bf16 activations saves a cast pass). An id outside [0, V)
// writes a NaN row, so a bad batch shows up in the loss instead of reading out of bounds.
// Backward (deterministic, no float atomics): the (id, position) pairs are radix-sorted by id,
// which is stable, so each vocabulary row's occurrences come out in ascending position order; one
// block per run of equal ids adds its dout rows in that order and adds the sum into dtable[id].
// The same inputs always give the same bits, whatever the launch timing.
#include <cub/device/device_radix_sort.cuh>

#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;

template <bool kVec, class Tab, class Out>
__global__ void embedding_kernel(const int* __restrict__ ids, const Tab* __restrict__ table, Out* __restrict__ out,
                                 std::int64_t N, int d, int V) {
  const std::int64_t per_row = kVec ? d / kChunk : d;
  const std::int64_t total = N * per_row;
  for (std::int64_t i = thread_index(); i < total; i += thread_stride()) {
    const std::int64_t n = i / per_row, j = i % per_row;
    const int id = ids[n];
    const bool ok = id >= 0 && id < V;
    if constexpr (kVec) {
      float v[kChunk];
      if (ok) load_chunk(table + static_cast<std::int64_t>(id) * d + j * kChunk, v);
      else
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[e] = NAN;
      store_chunk(out + n * d + j * kChunk, v);
    } else {
      out[n * d + j] = from_f32<Out>(ok ? to_f32(table[static_cast<std::int64_t>(id) * d + j]) : NAN);
    }
  }
}

__global__ void iota_kernel(int* __restrict__ x, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += thread_stride()) x[i] = static_cast<int>(i);
}

// Block b looks at sorted entry b; if it starts a run of equal ids, the block adds that run's dout
// rows (ascending positions) into dtable[id]. Four rows' loads are issued together; the adds stay
// in position order.
template <bool kVec, class G, class D>
__global__ void embedding_backward_kernel(const int* __restrict__ sorted_ids, const int* __restrict__ positions,
                                          const G* __restrict__ dout, D* __restrict__ dtable, std::int64_t N, int d,
                                          int V) {
  const std::int64_t b = blockIdx.x;
  const int id = sorted_ids[b];
  if ((b > 0 && sorted_ids[b - 1] == id) || id < 0 || id >= V) return;
  std::int64_t end = b + 1;
  while (end < N && sorted_ids[end] == id) ++end;
  D* dst = dtable + static_cast<std::int64_t>(id) * d;
  if constexpr (kVec) {
    for (int c = threadIdx.x * kChunk; c < d; c += blockDim.x * kChunk) {
      float acc[kChunk];
      load_chunk(dst + c, acc);
      for (std::int64_t k = b; k < end; ++k) {
        float v[kChunk];
        load_chunk(dout + static_cast<std::int64_t>(positions[k]) * d + c, v);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) acc[e] += v[e];
      }
      store_chunk(dst + c, acc);
    }
  } else {
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = to_f32(dst[c]);
      std::int64_t k = b;
      for (; k + 4 <= end; k += 4) {
        const float v0 = to_f32(dout[static_cast<std::int64_t>(positions[k]) * d + c]);
        const float v1 = to_f32(dout[static_cast<std::int64_t>(positions[k + 1]) * d + c]);
        const float v2 = to_f32(dout[static_cast<std::int64_t>(positions[k + 2]) * d + c]);
        const float v3 = to_f32(dout[static_cast<std::int64_t>(positions[k + 3]) * d + c]);
        acc += v0;
        acc += v1;
        acc += v2;
        acc += v3;
      }
      for (; k < end; ++k) acc += to_f32(dout[static_cast<std::int64_t>(positions[k]) * d + c]);
      dst[c] = from_f32<D>(acc);
    }
  }
}

// Binds A to the element type of `a` and B to that of `b` (fp32, bf16, fp16 each).
template <class F>
void dispatch2(DType a, DType b, const char* op, F&& body) {
  LMSCALE_CUDA_DISPATCH_FLOAT(a, op, A, { LMSCALE_CUDA_DISPATCH_FLOAT(b, op, B, body(A{}, B{})); });
}

}  // namespace

void embedding(Context& ctx, const Tensor& ids, const Tensor& table, Tensor& out) {
  const std::int64_t V = table.dim(0), d = table.dim(-1), N = ids.numel();
  LMSCALE_CHECK(ids.dtype() == DType::i32, "embedding: ids are {}, expected int32", dtype_name(ids.dtype()));
  LMSCALE_CHECK(out.numel() == N * d, "embedding: out {} for {} ids of width {}", shape_str(out.shape()), N, d);
  LMSCALE_CHECK(d <= 0x7fffffff && V <= 0x7fffffff, "embedding: table {} too large", shape_str(table.shape()));
  if (N == 0 || d == 0) return;
  Resources& r = resources(ctx);
  const bool vec = d % kChunk == 0 && is_aligned16(table.data()) && is_aligned16(out.data());
  const std::int64_t work = N * (vec ? d / kChunk : d);
  const unsigned grid = grid_for(work, kThreads, r.num_sms);
  dispatch2(table.dtype(), out.dtype(), "embedding", [&](auto ttag, auto otag) {
    using Tab = decltype(ttag);
    using Out = decltype(otag);
    auto kernel = vec ? embedding_kernel<true, Tab, Out> : embedding_kernel<false, Tab, Out>;
    kernel<<<grid, kThreads, 0, r.stream>>>(ids.data_as<const int>(), table.data_as<const Tab>(), out.data_as<Out>(),
                                            N, static_cast<int>(d), static_cast<int>(V));
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  const std::int64_t V = dtable.dim(0), d = dtable.dim(-1), N = ids.numel();
  LMSCALE_CHECK(ids.dtype() == DType::i32, "embedding_backward: ids are {}, expected int32", dtype_name(ids.dtype()));
  LMSCALE_CHECK(dout.numel() == N * d, "embedding_backward: dout {} for {} ids of width {}", shape_str(dout.shape()),
                N, d);
  LMSCALE_CHECK(N <= 0x7fffffff && d <= 0x7fffffff && V <= 0x7fffffff, "embedding_backward: sizes too large");
  if (N == 0 || d == 0) return;
  Resources& r = resources(ctx);
  const int n = static_cast<int>(N);
  // Sorted keys and positions, plus the positions in input order (0..N).
  Scratch keys(ctx, N * sizeof(int), "embedding_sort"), pos_in(ctx, N * sizeof(int), "embedding_sort"),
      pos_out(ctx, N * sizeof(int), "embedding_sort");
  iota_kernel<<<grid_for(N, kThreads, r.num_sms), kThreads, 0, r.stream>>>(pos_in.as<int>(), N);
  LMSCALE_CUDA_CHECK_LAUNCH();
  // All 32 key bits: negative ids sort first and ids >= V last, and the kernel skips both.
  std::size_t temp_bytes = 0;
  LMSCALE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids.data_as<const int>(), keys.as<int>(),
                                                     pos_in.as<const int>(), pos_out.as<int>(), n, 0, 32, r.stream));
  Scratch temp(ctx, std::max<std::size_t>(temp_bytes, 16), "embedding_sort_temp");   // non-null: null asks for the size
  LMSCALE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, ids.data_as<const int>(),
                                                     keys.as<int>(), pos_in.as<const int>(), pos_out.as<int>(), n, 0,
                                                     32, r.stream));
  const bool vec = d % kChunk == 0 && is_aligned16(dout.data()) && is_aligned16(dtable.data());
  const int threads = static_cast<int>(std::min<std::int64_t>(kThreads, ((vec ? d / kChunk : d) + 31) / 32 * 32));
  dispatch2(dout.dtype(), dtable.dtype(), "embedding_backward", [&](auto gtag, auto dtag) {
    using G = decltype(gtag);
    using D = decltype(dtag);
    auto kernel = vec ? embedding_backward_kernel<true, G, D> : embedding_backward_kernel<false, G, D>;
    kernel<<<static_cast<unsigned>(N), threads, 0, r.stream>>>(keys.as<const int>(), pos_out.as<const int>(),
                                                               dout.data_as<const G>(), dtable.data_as<D>(), N,
                                                               static_cast<int>(d), static_cast<int>(V));
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
