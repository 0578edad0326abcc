#pragma once
// Library handles and scratch space the CUDA ops share, bound to the runtime's compute stream:
// the cuBLASLt handle, its workspace and GEMM plan cache, the cuBLAS handle of the grouped GEMMs, the device's multiprocessor count (for
// grid sizing) and the RoPE cos/sin tables. Reached from an op through Context::cuda.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gemm.h"
#include "lmscale/core/allocator.h"
#include "lmscale/core/context.h"

namespace lmscale::ops::cuda {

// cos/sin of t * theta^(-2i/Dh) for t < T, i < Dh/2, as float2 [T, Dh/2], computed in double on
// the host once per (T, Dh, theta) so fp32 RoPE is exact to fp32 rounding at long positions.
struct RopeTable {
  std::int64_t T = 0, Dh = 0;
  double theta = 0;
  void* data = nullptr;   // float2 [T, Dh/2] on the device
  std::size_t bytes = 0;
};

struct Resources {
  Resources(cudaStream_t stream, Allocator& alloc, int device);
  ~Resources();
  Resources(const Resources&) = delete;
  Resources& operator=(const Resources&) = delete;

  // The table for (T, Dh, theta): the first one with T' >= T, same Dh and theta, else a new one.
  const RopeTable& rope_table(std::int64_t T, std::int64_t Dh, double theta);

  cudaStream_t stream;
  Allocator* alloc;
  int device = 0;
  int num_sms = 1;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;   // cuBLASLt workspace
  std::size_t workspace_bytes = 0;
  GemmPlanCache gemm_plans;
  // GEMMs queued now have a dimension that changes from call to call (the MoE experts' rows): a
  // new shape goes to its shape class's plan at once (gemm.h). Set by cuda::GemmShapesVary.
  bool gemm_shapes_vary = false;
  // cuBLAS (not Lt) for its grouped GEMM (gemm_grouped.h): made on the first grouped product, so
  // a run without one never creates it; shares the stream and the workspace above.
  cublasHandle_t blas = nullptr;
  // Grouped GEMM calls, the products they ran, and the products of lists cuBLAS cannot group
  // that ran as a loop of gemm() calls instead (gemm_grouped.h); calls of lmscale's own grouped
  // GEMM for Hopper (grouped_gemm_sm90.h, the MoE experts' wgmma form).
  struct GroupedGemmCounts {
    std::int64_t calls = 0, products = 0, looped_products = 0;
    std::int64_t sm90_calls = 0, sm90_launches = 0;
  } grouped_gemm;
  // Launches of the FP8 casts fused into SwiGLU (fp8_producers.cu): tests tell the kernel from the
  // composed fallback, whose results are the same bits.
  std::int64_t fp8_producer_cast_launches = 0;
  // Time up to 8 cuBLASLt candidates per new GEMM shape and keep the fastest, instead of taking the
  // heuristic's first. On when LMSCALE_GEMM_AUTOTUNE=1. Costs a few ms per shape on the first step;
  // the algorithm (and so the rounding) may then differ between runs.
  bool gemm_autotune = false;
  // SMs the cuBLASLt plans made now target (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET); 0 = all of
  // them. Set by ops::Runtime's GEMM carve-out (parallel.comm_sms) while collectives may run.
  std::int32_t gemm_sm_target = 0;
  std::vector<RopeTable> rope_tables;
  // How many streams GemmLanes spreads a loop's GEMMs over: 2, or 1 (tests compare the two).
  int gemm_lanes = 2;
  // The second stream of GemmLanes (gemm_lanes.h), its cuBLASLt workspace and events: made on the
  // first use, freed with the resources.
  struct SideLane {
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;
    cudaEvent_t fork = nullptr, done = nullptr;
  } side_lane;
};

// A temporary device buffer from the context's allocator, freed at scope exit. Frees are
// stream-ordered (core/cuda/device_allocator.h): the bytes may go to the next op on the same
// stream at once, which runs after the kernels that used them.
class Scratch {
 public:
  Scratch(Context& ctx, std::size_t bytes, const char* tag)
      : alloc_(ctx.allocator), bytes_(bytes), tag_(tag), ptr_(bytes ? alloc_->allocate(bytes, tag) : nullptr) {}
  ~Scratch() {
    if (ptr_) alloc_->deallocate(ptr_, bytes_, tag_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  Allocator* alloc_;
  std::size_t bytes_;
  const char* tag_;
  void* ptr_;
};

inline Resources& resources(Context& ctx) { return *static_cast<Resources*>(ctx.cuda); }
inline cudaStream_t stream(Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

}  // namespace lmscale::ops::cuda
