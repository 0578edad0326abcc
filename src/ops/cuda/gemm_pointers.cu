// store_pointers (gemm_grouped.h): the grouped GEMM's device pointer arrays, carried to the device
// in kernel launch parameters, 128 pointers (1 KiB of the 4 KiB parameter space) per launch.
#include "gemm_grouped.h"
#include "lmscale/core/cuda/cuda_check.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kPointersPerLaunch = 128;

struct PointerChunk {
  const void* p[kPointersPerLaunch];
};

__global__ void store_pointer_chunk(PointerChunk chunk, int n, const void** out) {
  const int i = static_cast<int>(threadIdx.x);
  if (i < n) out[i] = chunk.p[i];
}

}  // namespace

void store_pointers(const void* const* host, std::size_t n, const void** device, cudaStream_t stream) {
  for (std::size_t at = 0; at < n; at += kPointersPerLaunch) {
    PointerChunk chunk{};
    const int count = static_cast<int>(std::min<std::size_t>(kPointersPerLaunch, n - at));
    for (int i = 0; i < count; ++i) chunk.p[i] = host[at + static_cast<std::size_t>(i)];
    store_pointer_chunk<<<1, kPointersPerLaunch, 0, stream>>>(chunk, count, device + at);
    LMSCALE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace lmscale::ops::cuda
