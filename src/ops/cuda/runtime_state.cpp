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
  LMSCALE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  allocator = std::make_unique<CudaCachingAllocator>(dev % count);
  resources_ = {new cuda::Resources(stream, *allocator), [](cuda::Resources* r) { delete r; }};
}

Runtime::CudaState::~CudaState() {
  if (stream) cudaStreamSynchronize(stream);
  resources_.reset();
  allocator.reset();
  if (stream) cudaStreamDestroy(stream);
}

void Runtime::CudaState::synchronize() { LMSCALE_CUDA_CHECK(cudaStreamSynchronize(stream)); }

}  // namespace lmscale::ops
