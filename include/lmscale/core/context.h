#pragma once
// What an op needs besides its tensors: where temporaries come from and, on CUDA, the stream and
// library handles. Owned by ops::Runtime (one per process); passed by reference to every op.
#include "lmscale/core/allocator.h"
#include "lmscale/core/device.h"

namespace lmscale {

struct Context {
  Device device = Device::cpu;
  Allocator* allocator = nullptr;   // temporaries and new tensors on `device`
  Allocator* host = nullptr;        // host-side temporaries (same as allocator on CPU)
  void* stream = nullptr;           // cudaStream_t of the compute stream (CUDA only)
  void* cuda = nullptr;             // ops::cuda::Resources* (cuBLASLt handle, workspace)
  bool allow_tf32 = false;          // fp32 GEMMs may use TF32 (precision.tf32)
};

}  // namespace lmscale
