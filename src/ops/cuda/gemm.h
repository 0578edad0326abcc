#pragma once
// One cuBLASLt matrix product in column-major terms, C[m,n] = alpha * op(A)[m,k] * op(B)[k,n]
// + beta * C, with a plan cache: descriptors, layouts and the heuristic's algorithm are made once
// per (shape, leading dimensions, dtypes, compute mode, beta != 0, pointer alignment, SM target)
// and reused,
// so a training step calls cuBLASLt with no heuristic search after the first step.
//
// Precision (docs/architecture.md §2): fp32 inputs use CUBLAS_COMPUTE_32F (no TF32) unless allow_tf32, then
// CUBLAS_COMPUTE_32F_FAST_TF32; bf16/fp16 inputs always accumulate in fp32 (CUBLAS_COMPUTE_32F)
// and may write C in their own dtype or in fp32 (mixed-precision master gradients).
// FP8 inputs (e4m3/e5m2, docs/precision.md) accumulate in fp32 (CUBLAS_COMPUTE_32F, without
// cuBLASLt's fast-accumulation mode), write C in bf16 or fp32, and need trans_a && !trans_b (the
// "TN" layout, the only one Hopper's FP8 kernels take), K a multiple of 16 and 16-byte aligned
// operands; the operands' dequantisation factors come as device pointers (a_scale, b_scale).
#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

#include "lmscale/core/dtype.h"

namespace lmscale::ops::cuda {

struct Resources;

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* c = nullptr;
  std::int64_t ldc = 0;
  DType ab_type = DType::f32;   // A's dtype; B's too unless b_type says otherwise
  DType c_type = DType::f32;    // ab_type or fp32 (bf16 or fp32 for FP8 inputs)
  // FP8 products only: B's dtype when it differs from A's (e4m3 x e5m2), and the device pointers
  // (one fp32 each) of the factors cuBLASLt applies to A and B: C = alpha (a_scale A)(b_scale B) + beta C.
  std::optional<DType> b_type;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  float alpha = 1.f, beta = 0.f;
  // Strided batch: `batch` products, matrix i at a + i stride_a (elements; likewise b, c). A
  // stride of 0 shares that operand between the products (the input of the q, k, v projections).
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Runs the product on the resources' stream with their workspace.
void gemm(Resources& r, bool allow_tf32, const GemmArgs& g);

// The cached plans of one Resources. Opaque outside gemm.cpp.
class GemmPlanCache {
 public:
  GemmPlanCache();
  ~GemmPlanCache();
  GemmPlanCache(const GemmPlanCache&) = delete;
  GemmPlanCache& operator=(const GemmPlanCache&) = delete;
  struct Plan;
  struct Key {
    std::int64_t m, n, k, lda, ldb, ldc;
    std::uint32_t flags;   // trans_a, trans_b, dtypes, compute mode, beta != 0, alignments
    std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
    std::int32_t sm_target = 0;   // Resources::gemm_sm_target when the plan was made
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldc == o.ldc && flags == o.flags &&
             batch == o.batch && stride_a == o.stride_a && stride_b == o.stride_b && stride_c == o.stride_c &&
             sm_target == o.sm_target;
    }
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;
  std::size_t size() const { return plans.size(); }
};

}  // namespace lmscale::ops::cuda
