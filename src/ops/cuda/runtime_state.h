#pragma once
// CUDA side of ops::Runtime: device selection, the compute stream, the caching allocator and the
// library handles ops need (ops::cuda::Resources).
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "lmscale/core/cuda/device_allocator.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::ops {

namespace cuda {
struct Resources;   // cuda/resources.h
}

struct Runtime::CudaState {
  explicit CudaState(int device);
  ~CudaState();
  void synchronize();
  void* resources() { return resources_.get(); }
  // An event recorded on the compute stream; it returns to the pool when the last owner drops it.
  std::shared_ptr<void> record_event();
  // The same on another stream of this device.
  std::shared_ptr<void> record_event(cudaStream_t on);
  // The side stream (created on first use, lowest priority: the compute stream's kernels are
  // scheduled first when both have work).
  cudaStream_t side_stream();
  void wait(cudaStream_t waiter, void* event);
  bool done(void* event);
  double elapsed_ms(void* begin, void* end);

  int device;
  std::string name;
  int compute_capability = 0;   // major * 10 + minor
  cudaStream_t stream = nullptr;
  cudaStream_t side = nullptr;
  std::unique_ptr<CudaCachingAllocator> allocator;
  std::unique_ptr<cuda::Resources, void (*)(cuda::Resources*)> resources_{nullptr, nullptr};
  std::shared_ptr<std::vector<cudaEvent_t>> event_pool = std::make_shared<std::vector<cudaEvent_t>>();
};

}  // namespace lmscale::ops
