#include "resources.h"

#include "lmscale/core/error.h"

namespace lmscale::ops::cuda {

Resources::Resources(cudaStream_t s, Allocator& a) : stream(s), alloc(&a) {
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) throw Error("cublasLtCreate failed");
  workspace_bytes = 32u << 20;   // 32 MiB: what cuBLASLt's fastest Hopper kernels ask for
  workspace = alloc->allocate(workspace_bytes, "cublaslt_workspace");
}

Resources::~Resources() {
  alloc->deallocate(workspace, workspace_bytes, "cublaslt_workspace");
  if (lt) cublasLtDestroy(lt);
}

}  // namespace lmscale::ops::cuda
