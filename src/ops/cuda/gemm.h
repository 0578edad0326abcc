#pragma once
// One cuBLASLt matrix product in column-major terms, C[m,n] = alpha * op(A)[m,k] * op(B)[k,n]
// + beta * C, with a plan cache: descriptors, layouts and the heuristic's algorithm are made once
// per (shape, leading dimensions, dtypes, compute mode, beta != 0, pointer alignment, SM target)
// and reused,
// so a training step calls cuBLASLt with no heuristic search after the first step.
//
// Shape classes (products whose one dimension varies from call to call: an MoE expert's rows
// change every step). Each exact key belongs to a class: m, n, k rounded up by shape_class_dim,
// batch strides reduced to zero / non-zero, everything else exact. The first
// kExactShapesBeforeClassPlan distinct shapes of a class get exact plans of their own (so a
// fixed-shape product, which is one shape of its class, keeps its exact, possibly autotuned plan).
// A further new shape of the class runs on the class's one plan: its descriptor and the
// heuristic's algorithm for the class's representative (rounded-up) shape, its layouts set to the
// call's exact dims (host-side attributes, read when the product is queued), the algorithm
// checked for the exact shape (cublasLtMatmulAlgoCheck): no heuristic query and no cache growth
// per new row count. A shape the class's algorithm does not support gets an exact plan, cached
// while the class holds fewer than kExactPlansPerClass, else made, used and dropped; so the cache
// holds at most kExactPlansPerClass + 1 plans per class, and the classes a run can reach are
// bounded by its largest dimensions (the rows of a micro-batch times top-k for MoE).
//
// Shapes that vary: a caller whose products change a dimension every call (the MoE experts'
// rows; cuda::GemmShapesVary sets Resources::gemm_shapes_vary) skips the exact plans: the first
// new shape of a class makes the class's plan and every later one reuses it, so a class costs one
// heuristic query instead of kExactShapesBeforeClassPlan + 1. Exact shapes already cached are
// still found first; products outside such a scope (a dense model's fixed shapes) are unchanged.
//
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
  // FP8 products only (refused on others): Hopper's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM
  // = 1), the tensor cores' partial sums never promoted to fp32: faster, less accurate
  // (docs/precision.md, "Error bounds"). A property of the plan, so part of its key.
  bool fast_accum = false;
  float alpha = 1.f, beta = 0.f;
  // Strided batch: `batch` products, matrix i at a + i stride_a (elements; likewise b, c). A
  // stride of 0 shares that operand between the products (the input of the q, k, v projections).
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Runs the product on the resources' stream with their workspace.
void gemm(Resources& r, bool allow_tf32, const GemmArgs& g);

// A dimension's shape class: the next power of two up to 256, above that the next multiple of
// 256. 256 is the widest tile edge of the Hopper GEMM kernels cuBLASLt picks from, so every
// shape of a class has the same tile grid as its representative within one tile per dimension:
// the wave count the heuristic weighs differs little between them. Small sizes get power-of-two
// classes since there one tile covers the whole dimension and the heuristic's choice depends on
// the size's magnitude (GEMV-like, split-k) rather than on a tile count.
std::int64_t shape_class_dim(std::int64_t x);
inline constexpr int kExactShapesBeforeClassPlan = 4;
inline constexpr int kExactPlansPerClass = 16;
// Whether a new exact shape runs on its class's plan: the class holds kExactShapesBeforeClassPlan
// exact plans already, or the shapes vary (above).
constexpr bool uses_class_plan(int class_exact_plans, bool shapes_vary) {
  return shapes_vary || class_exact_plans >= kExactShapesBeforeClassPlan;
}

// The cached plans of one Resources. Opaque outside gemm.cpp (but for Key, below).
class GemmPlanCache {
 public:
  GemmPlanCache();
  ~GemmPlanCache();
  GemmPlanCache(const GemmPlanCache&) = delete;
  GemmPlanCache& operator=(const GemmPlanCache&) = delete;
  struct Plan;
  struct Key {
    std::int64_t m, n, k, lda, ldb, ldc;
    std::uint64_t flags;   // trans_a, trans_b, dtypes, compute mode, beta != 0, alignments, fast_accum
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
  // Exact plans, and per shape class its plan (made on first need) and how many exact plans of
  // its shapes `plans` holds.
  struct ShapeClass {
    std::unique_ptr<Plan> plan;
    int exact_plans = 0;
  };
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans;
  std::unordered_map<Key, ShapeClass, KeyHash> classes;
  // Products run on a class plan, and class-path products its algorithm did not support (they
  // ran on an exact plan instead).
  std::int64_t class_products = 0, class_fallbacks = 0;
  // Plans made (each a cuBLASLt heuristic query: host time on the critical path of the launch).
  std::int64_t plans_made = 0;
  // Plans held: exact ones and shape classes' ones.
  std::size_t size() const;
};

// The exact plan key of g (what gemm() looks plans up by): its shape, leading dimensions, batch
// strides, the flags (transposes, dtypes, tf32 when allow_tf32 and A is fp32, beta != 0, the
// operands' pointer alignments, fast_accum) and sm_target. Host arithmetic only, no CUDA call, so
// the unit tests check on a CPU that products differing in a plan property get different keys.
GemmPlanCache::Key gemm_plan_key(const GemmArgs& g, bool allow_tf32, std::int32_t sm_target);

}  // namespace lmscale::ops::cuda
