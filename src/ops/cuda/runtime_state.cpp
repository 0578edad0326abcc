#include "runtime_state.h"

#include "lmscale/core/cuda/cuda_check.h"
#include "resources.h"

namespace lmscale::ops {

Runtime::CudaState::CudaState(int dev) : device(dev) {
  int count = 0;
  LMSCALE_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) throw Error("parallel.device=cuda but no CUDA device is visible");
  LMSCALE_CUDA_CHECK(cudaSetDevice(dev % count));
  cudaDeviceProp prop{};
  LMSCALE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev % count));
  name = prop.name;
  compute_capability = prop.major * 10 + prop.minor;
  LMSCALE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Blocks are stream-ordered on the compute stream (core/cuda/device_allocator.h).
  allocator = std::make_unique<CudaCachingAllocator>(dev % count, stream);
  resources_ = {new cuda::Resources(stream, *allocator, dev % count), [](cuda::Resources* r) { delete r; }};
}

Runtime::CudaState::~CudaState() {
  if (side) cudaStreamSynchronize(side);
  if (stream) cudaStreamSynchronize(stream);
  for (cudaEvent_t e : *event_pool) cudaEventDestroy(e);
  event_pool->clear();
  resources_.reset();
  allocator.reset();
  if (stream) cudaStreamDestroy(stream);
  if (side) cudaStreamDestroy(side);
}

cudaStream_t Runtime::CudaState::side_stream() {
  if (!side) {
    int least = 0, greatest = 0;
    LMSCALE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    LMSCALE_CUDA_CHECK(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, least));
  }
  return side;
}

void Runtime::CudaState::wait(cudaStream_t waiter, void* event) {
  LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(waiter, static_cast<cudaEvent_t>(event), 0));
}

bool Runtime::CudaState::done(void* event) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) return false;
  LMSCALE_CUDA_CHECK(e);
  return true;
}

void Runtime::CudaState::synchronize() { LMSCALE_CUDA_CHECK(cudaStreamSynchronize(stream)); }

}  // namespace lmscale::ops

namespace lmscale::ops {

std::shared_ptr<void> Runtime::CudaState::record_event() { return record_event(stream); }

std::shared_ptr<void> Runtime::CudaState::record_event(cudaStream_t on) {
  cudaEvent_t e;
  if (event_pool->empty()) {
    LMSCALE_CUDA_CHECK(cudaEventCreate(&e));
  } else {
    e = event_pool->back();
    event_pool->pop_back();
  }
  LMSCALE_CUDA_CHECK(cudaEventRecord(e, on));
  // The pool outlives the runtime only through this weak reference: events released after the
  // runtime is gone are destroyed instead of pooled.
  std::weak_ptr<std::vector<cudaEvent_t>> pool = event_pool;
  return std::shared_ptr<void>(e, [pool](void* p) {
    if (auto v = pool.lock()) v->push_back(static_cast<cudaEvent_t>(p));
    else cudaEventDestroy(static_cast<cudaEvent_t>(p));
  });
}

double Runtime::CudaState::elapsed_ms(void* begin, void* end) {
  LMSCALE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0;
  LMSCALE_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin), static_cast<cudaEvent_t>(end)));
  return ms;
}

}  // namespace lmscale::ops
