#pragma once
// What an op needs besides its tensors: where temporaries come from and, on CUDA, the stream and
// library handles. Owned by ops::Runtime (one per process); passed by reference to every op.
#include "lmscale/core/allocator.h"
#include "lmscale/core/device.h"

#include <cstdint>

namespace lmscale {

// Matrix products the linear ops dispatch (ops::linear, linear_backward, linear_group*,
// linear_side_by_side*), by pass, counted while a Context points at one (tests: how many GEMMs a
// block issues). A strided batch of n counts n; the one weight-gradient GEMM of a back-to-back
// group counts 1 also on the CPU, which runs it per weight (ops.h). FP8 and MoE-expert products
// are not counted.
struct LinearProductCounts {
  std::int64_t forward = 0;       // y = x w^T
  std::int64_t data_grad = 0;     // dx = dy w
  std::int64_t weight_grad = 0;   // dw (+)= dy^T x
};

struct Context {
  Device device = Device::cpu;
  Allocator* allocator = nullptr;   // temporaries and new tensors on `device`
  Allocator* host = nullptr;        // host-side temporaries (same as allocator on CPU)
  void* stream = nullptr;           // cudaStream_t of the compute stream (CUDA only)
  void* cuda = nullptr;             // ops::cuda::Resources* (cuBLASLt handle, workspace)
  bool allow_tf32 = false;          // fp32 GEMMs may use TF32 (precision.tf32)
  LinearProductCounts* linear_products = nullptr;   // counted when set (not owned)
};

}  // namespace lmscale
