// cuda::for_each_lane (lmscale/ops/lanes.h): fork the compute stream into up to kLanes streams,
// queue piece i on lane i % L, join every lane back into the compute stream.
#include <algorithm>
#include <memory>
#include <vector>

#include "cuda_ops.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

// Four lanes: an MoE block's 8 (or, with ep, 4) experts in two (one) rounds. More streams add
// plan caches and 32 MiB workspaces and, past the point where the GPU is full, only contention.
constexpr int kLanes = 4;

std::unique_ptr<Resources> make_lane(const Resources& parent) {
  int least = 0, greatest = 0, priority = 0;
  LMSCALE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  LMSCALE_CUDA_CHECK(cudaStreamGetPriority(parent.stream, &priority));
  cudaStream_t s = nullptr;
  LMSCALE_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));   // as the compute stream's
  auto lane = std::make_unique<Resources>(s, *parent.alloc, parent.device);
  lane->owns_stream = true;
  LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&lane->join_event, cudaEventDisableTiming));
  return lane;
}

// Joins the lanes that were forked, also when a piece throws (the compute stream must not run
// ahead of work still queued on a lane that reads its buffers).
struct Join {
  Resources& parent;
  int lanes;
  ~Join() {
    for (int l = 0; l < lanes; ++l) {
      Resources& q = *parent.lanes[static_cast<std::size_t>(l)];
      cudaEventRecord(q.join_event, q.stream);
      cudaStreamWaitEvent(parent.stream, q.join_event, 0);
    }
  }
};

}  // namespace

void for_each_lane(Context& ctx, int n, const std::function<void(Context& lane, int i)>& work) {
  Resources& r = resources(ctx);
  const int L = std::min(n, kLanes);
  if (L <= 1 || r.owns_stream) {   // one piece, or already on a lane: no nesting
    for (int i = 0; i < n; ++i) work(ctx, i);
    return;
  }
  while (static_cast<int>(r.lanes.size()) < L) r.lanes.push_back(make_lane(r));
  if (!r.fork_event) LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&r.fork_event, cudaEventDisableTiming));
  LMSCALE_CUDA_CHECK(cudaEventRecord(r.fork_event, r.stream));
  std::vector<Context> lanes(static_cast<std::size_t>(L), ctx);
  for (int l = 0; l < L; ++l) {
    Resources& q = *r.lanes[static_cast<std::size_t>(l)];
    q.gemm_autotune = r.gemm_autotune;       // the parent's GEMM settings hold on its lanes
    q.gemm_sm_target = r.gemm_sm_target;
    LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(q.stream, r.fork_event, 0));
    lanes[static_cast<std::size_t>(l)].stream = q.stream;
    lanes[static_cast<std::size_t>(l)].cuda = &q;
  }
  Join join{r, L};
  for (int i = 0; i < n; ++i) work(lanes[static_cast<std::size_t>(i % L)], i);
}

}  // namespace lmscale::ops::cuda
