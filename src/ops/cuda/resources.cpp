#include "resources.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"

namespace lmscale::ops::cuda {

Resources::Resources(cudaStream_t s, Allocator& a, int dev) : stream(s), alloc(&a), device(dev) {
  LMSCALE_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) throw Error("cublasLtCreate failed");
  const char* tune = std::getenv("LMSCALE_GEMM_AUTOTUNE");
  gemm_autotune = tune && std::string(tune) == "1";
  workspace_bytes = 32u << 20;   // 32 MiB: what cuBLASLt's fastest Hopper kernels ask for
  workspace = alloc->allocate(workspace_bytes, "cublaslt_workspace");
}

Resources::~Resources() {
  // Work queued on the stream may still read the tables and the workspace.
  cudaStreamSynchronize(stream);
  for (auto& t : rope_tables) alloc->deallocate(t.data, t.bytes, "rope_table");
  alloc->deallocate(workspace, workspace_bytes, "cublaslt_workspace");
  if (side_lane.stream) {
    cudaStreamSynchronize(side_lane.stream);
    alloc->deallocate(side_lane.workspace, workspace_bytes, "cublaslt_workspace");
    cudaEventDestroy(side_lane.fork);
    cudaEventDestroy(side_lane.done);
    cudaStreamDestroy(side_lane.stream);
  }
  if (blas) cublasDestroy(blas);
  if (lt) cublasLtDestroy(lt);
}

const RopeTable& Resources::rope_table(std::int64_t T, std::int64_t Dh, double theta) {
  for (const auto& t : rope_tables)
    if (t.T >= T && t.Dh == Dh && t.theta == theta) return t;
  RopeTable t;
  t.T = T;
  t.Dh = Dh;
  t.theta = theta;
  const std::int64_t half = Dh / 2;
  std::vector<float> host(static_cast<std::size_t>(T * half * 2));
  for (std::int64_t pos = 0; pos < T; ++pos)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(Dh));
      host[static_cast<std::size_t>((pos * half + i) * 2)] = static_cast<float>(std::cos(angle));
      host[static_cast<std::size_t>((pos * half + i) * 2 + 1)] = static_cast<float>(std::sin(angle));
    }
  t.bytes = host.size() * sizeof(float);
  t.data = alloc->allocate(t.bytes, "rope_table");
  // Synchronous: `host` dies at return. Happens once per (T, Dh, theta).
  LMSCALE_CUDA_CHECK(cudaMemcpyAsync(t.data, host.data(), t.bytes, cudaMemcpyHostToDevice, stream));
  LMSCALE_CUDA_CHECK(cudaStreamSynchronize(stream));
  rope_tables.push_back(t);
  return rope_tables.back();
}

}  // namespace lmscale::ops::cuda
