// The mixture-of-experts dispatch plan on CUDA (lmscale/ops/moe.h): the CPU
// plan exactly, from a deterministic scan instead of the CPU's sequential pass.
// Three kernels:
//   1. one block per group: each assignment's place q in its expert's queue of
//   the group, in
//      (token, j) order, chunk by chunk of the block's threads (a warp ranks
//      its equal experts with
//      __match_any_sync, the warps are prefixed per expert in warp order); slot
//      = q if q < capacity else -1 (provisional), and per group the assignments
//      per expert before and after the capacity [G, E];
//   2. one block: per expert, a prefix over the groups (where each group's kept
//   rows of the expert
//      start) and the totals kept[E], routed[E]; then where each expert's rows
//      start (a prefix over the experts);
//   3. elementwise: slot = expert start + group start + q.
// Expert indices outside [0, E) (which moe_route never writes) are dropped
// (slot -1) and counted nowhere; the CPU reference throws on them.
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "moe_cuda.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExperts = 1024;

// Shared memory: queue[E] (assignments per expert so far in the group),
// per_warp[kWarps][E].
__global__ void plan_queue_kernel(const int* __restrict__ experts, std::int64_t group_assignments, int E,
                                  long long capacity, int* __restrict__ slot, int* __restrict__ group_routed,
                                  int* __restrict__ group_kept) {
  extern __shared__ int smem[];
  int* queue = smem;
  int* per_warp = smem + E;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t a0 = static_cast<std::int64_t>(blockIdx.x) * group_assignments;
  for (int e = threadIdx.x; e < E; e += kThreads) queue[e] = 0;
  for (std::int64_t c0 = 0; c0 < group_assignments; c0 += kThreads) {
    for (int i = threadIdx.x; i < kWarps * E; i += kThreads) per_warp[i] = 0;
    __syncthreads();
    const std::int64_t i = c0 + threadIdx.x;
    int e = i < group_assignments ? experts[a0 + i] : -1;
    if (e >= E) e = -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1u));  // equal experts in lower lanes
    if (e >= 0 && rank == 0) per_warp[warp * E + e] = __popc(same);
    __syncthreads();
    for (int x = threadIdx.x; x < E; x += kThreads) {  // per expert: warp offsets, in warp order
      int run = queue[x];
      for (int w = 0; w < kWarps; ++w) {
        const int t = per_warp[w * E + x];
        per_warp[w * E + x] = run;
        run += t;
      }
      queue[x] = run;
    }
    __syncthreads();
    if (i < group_assignments) {
      const long long q = e >= 0 ? per_warp[warp * E + e] + rank : capacity;
      slot[a0 + i] = q < capacity ? static_cast<int>(q) : -1;
    }
    __syncthreads();  // per_warp is cleared next chunk
  }
  for (int e = threadIdx.x; e < E; e += kThreads) {
    group_routed[static_cast<std::int64_t>(blockIdx.x) * E + e] = queue[e];
    group_kept[static_cast<std::int64_t>(blockIdx.x) * E + e] =
        static_cast<int>(queue[e] < capacity ? queue[e] : capacity);
  }
}

// group_kept[g,e] becomes where group g's kept rows of expert e start among the
// expert's rows; start[e] where expert e's rows start in xe.
__global__ void plan_prefix_kernel(int G, int E, int* __restrict__ group_kept, const int* __restrict__ group_routed,
                                   int* __restrict__ kept, int* __restrict__ routed, int* __restrict__ start) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0, r = 0;
    for (int g = 0; g < G; ++g) {
      const int t = group_kept[g * E + e];
      group_kept[g * E + e] = run;
      run += t;
      r += group_routed[g * E + e];
    }
    kept[e] = run;
    routed[e] = r;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0;
    for (int e = 0; e < E; ++e) {
      start[e] = off;
      off += kept[e];
    }
  }
}

__global__ void plan_slot_kernel(const int* __restrict__ experts, std::int64_t assignments,
                                 std::int64_t group_assignments, int E, const int* __restrict__ group_start,
                                 const int* __restrict__ start, int* __restrict__ slot) {
  for (std::int64_t i = thread_index(); i < assignments; i += thread_stride()) {
    const int q = slot[i];
    if (q < 0) continue;
    const int e = experts[i];
    slot[i] = start[e] + group_start[(i / group_assignments) * E + e] + q;
  }
}

}  // namespace

void moe_plan(Context& ctx, const Tensor& experts, std::int64_t group, std::int64_t capacity, Tensor& slot,
              Tensor& kept, Tensor& routed) {
  const std::int64_t N = experts.dim(0), k = experts.dim(1), E = kept.numel();
  LMSCALE_CHECK(E <= kMaxExperts, "ops::moe_plan: {} experts; the CUDA plan handles at most {}", E, kMaxExperts);
  LMSCALE_CHECK(N * k < (std::int64_t{1} << 31), "ops::moe_plan: {} assignments exceed the int32 slots", N * k);
  if (E == 0) return;
  if (N == 0) {
    fill(ctx, kept, 0.0);
    fill(ctx, routed, 0.0);
    return;
  }
  const std::int64_t G = N / group, A = group * k;
  Resources& r = resources(ctx);
  Scratch scratch(ctx, static_cast<std::size_t>(2 * G * E + E) * sizeof(int), "moe_plan");
  int* group_routed = scratch.as<int>();
  int* group_kept = group_routed + G * E;
  int* start = group_kept + G * E;
  const std::size_t smem = static_cast<std::size_t>((1 + kWarps) * E) * sizeof(int);
  plan_queue_kernel<<<static_cast<unsigned>(G), kThreads, smem, r.stream>>>(
      experts.data_as<const int>(), A, static_cast<int>(E), static_cast<long long>(capacity), slot.data_as<int>(),
      group_routed, group_kept);
  LMSCALE_CUDA_CHECK_LAUNCH();
  plan_prefix_kernel<<<1, kThreads, 0, r.stream>>>(static_cast<int>(G), static_cast<int>(E), group_kept, group_routed,
                                                   kept.data_as<int>(), routed.data_as<int>(), start);
  LMSCALE_CUDA_CHECK_LAUNCH();
  plan_slot_kernel<<<grid_for(N * k, kThreads, r.num_sms), kThreads, 0, r.stream>>>(
      experts.data_as<const int>(), N * k, A, static_cast<int>(E), group_kept, start, slot.data_as<int>());
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
