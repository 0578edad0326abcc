#pragma once
// The MoE experts' products (ops/expert_products.h) as one cuBLAS grouped GEMM
// (cublasGemmGroupedBatchedEx, cuBLAS 12.5+): one launch for all experts' products of a
// projection, each expert its own m, n or k, where a loop of cuBLASLt GEMMs (gemm.h) launches one
// per expert and makes a plan per new row count.
//
// cuBLAS groups only products whose output dtype is the inputs' (bf16 -> bf16, fp16 -> fp16,
// fp32 -> fp32; CUBLAS_COMPUTE_32F, or _FAST_TF32 for fp32 when TF32 is allowed), reads its
// pointer arrays from device memory and, for 16-bit inputs, wants 16-byte aligned matrices. A list
// that breaks a rule (the weight gradients of bf16 activations into fp32 master gradients;
// misaligned rows; a dimension beyond int) runs as a loop of gemm() calls instead, one per
// problem, in the shapes-vary mode of the plan cache (gemm.h): the loop's products, the loop's
// results.
#include <cuda_runtime.h>

#include <vector>

#include "../expert_products.h"
#include "lmscale/core/context.h"
#include "lmscale/core/dtype.h"

namespace lmscale::ops::cuda {

struct Resources;

// Base pointers of each copy of the products' operands (copies of the spec: w1 and w3).
struct GroupedOperands {
  std::vector<const void*> a, b;
  std::vector<void*> c;
  DType ab_type = DType::f32, c_type = DType::f32;
};

// Runs the products on the resources' stream: one grouped GEMM when cuBLAS takes them, else the
// loop (above). Counts each in Resources::grouped_gemm.
void gemm_grouped(Resources& r, bool allow_tf32, const detail::GroupedProducts& p, const GroupedOperands& o);

// Whether cuBLAS's grouped GEMM takes products of these dtypes (the rule above).
bool groupable_dtypes(DType ab_type, DType c_type);

// Writes n host pointers to `device` (n device words) on `stream` by kernels whose launch
// parameters carry them (no pinned staging buffer to keep alive, capturable in a CUDA graph).
void store_pointers(const void* const* host, std::size_t n, const void** device, cudaStream_t stream);

// While alive, every GEMM queued on the context's resources is marked as one whose dimensions
// change from call to call (gemm.h, "shapes vary"): a new shape runs on its class's plan at once.
// Set by the MoE experts' loop; restores the previous mode at scope exit.
class GemmShapesVary {
 public:
  explicit GemmShapesVary(Context& ctx);
  explicit GemmShapesVary(Resources& r);
  ~GemmShapesVary();
  GemmShapesVary(const GemmShapesVary&) = delete;
  GemmShapesVary& operator=(const GemmShapesVary&) = delete;

 private:
  Resources* r_;
  bool before_;
};

}  // namespace lmscale::ops::cuda
