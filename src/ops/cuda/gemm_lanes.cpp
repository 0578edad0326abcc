// Two streams for a loop's independent GEMMs (gemm_lanes.h).
#include "gemm_lanes.h"

#include "lmscale/core/cuda/cuda_check.h"

namespace lmscale::ops::cuda {

GemmLanes::GemmLanes(Context& ctx) : r_(resources(ctx)), main_(r_.stream), main_workspace_(r_.workspace) {
  if (r_.gemm_lanes > 1 && !r_.side_lane.stream) {
    LMSCALE_CUDA_CHECK(cudaStreamCreateWithFlags(&r_.side_lane.stream, cudaStreamNonBlocking));
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&r_.side_lane.fork, cudaEventDisableTiming));
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&r_.side_lane.done, cudaEventDisableTiming));
    // From the allocator, so the tracker (and the memory model, jobs/predict) count it; held until
    // the resources go.
    r_.side_lane.workspace = r_.alloc->allocate(r_.workspace_bytes, "cublaslt_workspace");
  }
}

GemmLanes::~GemmLanes() {
  // A destructor must not throw (it may run while an exception unwinds): the compute stream comes
  // back, and is ordered after the second lane where that still works; a CUDA error here shows at
  // the next checked call. The normal path has joined already.
  r_.stream = main_, r_.workspace = main_workspace_;
  if (forked_ && cudaEventRecord(r_.side_lane.done, r_.side_lane.stream) == cudaSuccess)
    cudaStreamWaitEvent(main_, r_.side_lane.done, 0);
}

void GemmLanes::use(std::size_t i) {
  if (r_.gemm_lanes < 2 || i % 2 == 0) {
    r_.stream = main_, r_.workspace = main_workspace_;
    return;
  }
  if (!forked_) {
    LMSCALE_CUDA_CHECK(cudaEventRecord(r_.side_lane.fork, main_));
    LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(r_.side_lane.stream, r_.side_lane.fork, 0));
    forked_ = true;
  }
  r_.stream = r_.side_lane.stream, r_.workspace = r_.side_lane.workspace;
}

void GemmLanes::join() {
  r_.stream = main_, r_.workspace = main_workspace_;
  if (!forked_) return;
  LMSCALE_CUDA_CHECK(cudaEventRecord(r_.side_lane.done, r_.side_lane.stream));
  LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(main_, r_.side_lane.done, 0));
  forked_ = false;
}

}  // namespace lmscale::ops::cuda
