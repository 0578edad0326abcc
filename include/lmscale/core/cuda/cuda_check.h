#pragma once
// Error checks for CUDA runtime calls and kernel launches: throw lmscale::Error naming the call.
#include <cuda_runtime.h>

#include "lmscale/core/error.h"

#define LMSCALE_CUDA_CHECK(expr)                                                                        \
  do {                                                                                                  \
    cudaError_t _e = (expr);                                                                            \
    if (_e != cudaSuccess) {                                                                            \
      throw ::lmscale::Error(fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #expr, cudaGetErrorString(_e))); \
    }                                                                                                   \
  } while (0)

// After a kernel launch: catches launch-configuration errors without synchronising.
#define LMSCALE_CUDA_CHECK_LAUNCH() LMSCALE_CUDA_CHECK(cudaGetLastError())
