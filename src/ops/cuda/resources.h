#pragma once
// Library handles and scratch space the CUDA ops share: the cuBLASLt handle and its workspace,
// bound to the runtime's compute stream. Reached from an op through Context::cuda.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "lmscale/core/allocator.h"
#include "lmscale/core/context.h"

namespace lmscale::ops::cuda {

struct Resources {
  Resources(cudaStream_t stream, Allocator& alloc);
  ~Resources();
  Resources(const Resources&) = delete;
  Resources& operator=(const Resources&) = delete;

  cudaStream_t stream;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;        // cuBLASLt workspace
  std::size_t workspace_bytes = 0;
  Allocator* alloc;
};

inline Resources& resources(Context& ctx) { return *static_cast<Resources*>(ctx.cuda); }
inline cudaStream_t stream(Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

}  // namespace lmscale::ops::cuda
