// ops::CudaGraph (ops/cuda_graph.h): stream capture into a graph with the allocator's graph pool.
#include "lmscale/ops/cuda_graph.h"

#include <fmt/format.h>

#include "lmscale/core/error.h"

#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>

#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/cuda/device_allocator.h"
#endif

namespace lmscale::ops {

#ifdef LMSCALE_WITH_CUDA

struct CudaGraph::State {
  CudaCachingAllocator* alloc = nullptr;
  cudaStream_t stream = nullptr;
  int pool = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool used = false;   // capture() was called (successful or not)
};

CudaGraph::CudaGraph(Runtime& rt) : rt_(rt), state_(std::make_unique<State>()) {
  if (rt.device() != Device::cuda)
    throw UsageError("train.cuda_graphs = true needs a CUDA device; set train.cuda_graphs = false on CPUs");
  state_->alloc = dynamic_cast<CudaCachingAllocator*>(rt.ctx().allocator);
  LMSCALE_CHECK(state_->alloc, "CudaGraph: the runtime's device allocator is not the caching allocator");
  state_->stream = static_cast<cudaStream_t>(rt.ctx().stream);
  state_->pool = state_->alloc->create_pool();
}

CudaGraph::~CudaGraph() {
  // No throwing here: a failed stream leaves the pool to the allocator's destructor.
  if (cudaStreamSynchronize(state_->stream) != cudaSuccess) return;
  if (state_->exec) cudaGraphExecDestroy(state_->exec);
  if (state_->graph) cudaGraphDestroy(state_->graph);
  state_->alloc->release_pool(state_->pool);
}

void CudaGraph::capture(const std::function<void()>& body) {
  LMSCALE_CHECK(!state_->used, "CudaGraph::capture: a graph is captured once");
  state_->used = true;
  // Thread-local: the host threads of other components (the watchdog, the metrics stream) may
  // make their own CUDA calls meanwhile; this thread may make no call that would wait.
  LMSCALE_CUDA_CHECK(cudaStreamBeginCapture(state_->stream, cudaStreamCaptureModeThreadLocal));
  state_->alloc->begin_capture(state_->pool);
  rt_.set_capturing(true);
  auto finish = [&] {
    rt_.set_capturing(false);
    state_->alloc->end_capture();
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(state_->stream, &g);
    return std::make_pair(e, g);
  };
  try {
    body();
  } catch (...) {
    auto [e, g] = finish();
    if (g) cudaGraphDestroy(g);
    (void)e;
    cudaGetLastError();   // an invalidated capture's error is not the one to report
    throw;
  }
  auto [e, g] = finish();
  if (e != cudaSuccess) {
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw Error(fmt::format("CUDA graph capture failed: {} (something in the step waited for the device or copied "
                            "from pageable host memory; run it without train.cuda_graphs)",
                            cudaGetErrorString(e)));
  }
  state_->graph = g;
  LMSCALE_CUDA_CHECK(cudaGraphInstantiate(&state_->exec, state_->graph, 0));
  // Uploaded now, so the first replay is not slower than the others.
  LMSCALE_CUDA_CHECK(cudaGraphUpload(state_->exec, state_->stream));
}

void CudaGraph::replay() {
  LMSCALE_CHECK(state_->exec, "CudaGraph::replay before a successful capture");
  LMSCALE_CUDA_CHECK(cudaGraphLaunch(state_->exec, state_->stream));
}

bool CudaGraph::captured() const { return state_->exec != nullptr; }

std::size_t CudaGraph::nodes() const {
  if (!state_->graph) return 0;
  std::size_t n = 0;
  LMSCALE_CUDA_CHECK(cudaGraphGetNodes(state_->graph, nullptr, &n));
  return n;
}

std::size_t CudaGraph::pool_bytes() const { return state_->alloc->pool_bytes(state_->pool); }

#else   // no CUDA in this build

struct CudaGraph::State {};

CudaGraph::CudaGraph(Runtime& rt) : rt_(rt) {
  throw UsageError("train.cuda_graphs = true needs a CUDA device (this lmscale was built without CUDA); set "
                   "train.cuda_graphs = false");
}
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(const std::function<void()>&) {}
void CudaGraph::replay() {}
bool CudaGraph::captured() const { return false; }
std::size_t CudaGraph::nodes() const { return 0; }
std::size_t CudaGraph::pool_bytes() const { return 0; }

#endif

}  // namespace lmscale::ops
