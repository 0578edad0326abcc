#pragma once
// One CUDA graph: the work queued on the runtime's compute stream while a host function runs,
// captured once and replayed with one launch (train.cuda_graphs; docs/architecture.md §5, "The
// captured step").
//
// - Memory: the capture draws from a graph pool of the caching allocator of its own
//   (core/cuda/device_allocator.h, begin_capture): the blocks the graph's kernels use stay
//   reserved for it while it lives, and return to the shared cache when it is destroyed. Capture
//   after an eager run of the same work, so the allocator's cache, the cuBLASLt plans and the
//   one-time tables are warm: a capture must not wait for the device.
// - Values: a replay repeats every kernel with the arguments it was captured with, on the same
//   addresses. What changes between replays must be in device memory the kernels read, written
//   before replay() (ops/device_step.h); the host code of the body does not run again.
// - Streams: the capture is thread-local; other streams join it through Runtime marks (events)
//   recorded and waited inside the body, as they would outside.
// CUDA only: constructing one on the CPU throws UsageError naming train.cuda_graphs.
#include <cstddef>
#include <functional>
#include <memory>

#include "lmscale/ops/runtime.h"

namespace lmscale::ops {

class CudaGraph {
 public:
  explicit CudaGraph(Runtime& rt);
  // Waits for the compute stream (a replay may still run), frees the graph, releases its pool.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs `body` on the host with the compute stream in capture and the allocator drawing from the
  // graph's pool (Runtime::capturing() is true meanwhile); nothing runs on the device. Once only.
  // An exception from `body`, or a capture the driver invalidated (a host wait, a pageable copy,
  // an illegal call inside it), ends the capture and throws; the object is then unusable.
  void capture(const std::function<void()>& body);
  // Launches the captured graph on the compute stream (no host wait).
  void replay();
  bool captured() const;
  // Kernel, copy and other nodes in the graph; bytes of the graph's allocator pool.
  std::size_t nodes() const;
  std::size_t pool_bytes() const;

 private:
  struct State;
  Runtime& rt_;
  std::unique_ptr<State> state_;
};

}  // namespace lmscale::ops
