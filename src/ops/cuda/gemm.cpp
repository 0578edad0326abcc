#include "gemm.h"

#include <fmt/format.h>

#include <algorithm>

#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

const char* status_name(cublasStatus_t s) { return cublasGetStatusName(s); }

#define LMSCALE_CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                                      \
    cublasStatus_t _s = (expr);                                                                             \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                                        \
      throw ::lmscale::Error(fmt::format("{}:{}: {} failed: {}", __FILE__, __LINE__, #expr, status_name(_s))); \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::e4m3: return CUDA_R_8F_E4M3;
    case DType::e5m2: return CUDA_R_8F_E5M2;
    default:
      throw Error(fmt::format("gemm: dtype {} is not supported on CUDA (fp32, bf16, fp16, fp8_e4m3, fp8_e5m2 are)",
                              dtype_name(t)));
  }
}

// Largest power of two (<= 256) dividing the address: cuBLASLt picks kernels by the alignment it
// is promised, and parameter views inside the flat buffer need not be 256-byte aligned.
std::uint32_t alignment(const void* p) {
  std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}
// The alignment every matrix of a strided batch has: that of the first and of the stride.
std::uint32_t batch_alignment(const void* p, std::int64_t stride, DType t) {
  const std::uint32_t base = alignment(p);
  if (stride == 0) return base;
  const auto bytes = static_cast<std::uintptr_t>(stride) * dtype_size(t);
  return std::min(base, alignment(reinterpret_cast<const void*>(bytes)));
}
std::uint32_t log2u(std::uint32_t x) {
  std::uint32_t r = 0;
  while (x > 1) x >>= 1, ++r;
  return r;
}

bool is_fp8(DType t) { return t == DType::e4m3 || t == DType::e5m2; }

// The rules of cuBLASLt's FP8 products (gemm.h), checked before cuBLASLt is asked: its own
// failure (no algorithm, or CUBLAS_STATUS_NOT_SUPPORTED) would not say which rule was broken.
void check_fp8(const GemmArgs& g, DType bt) {
  LMSCALE_CHECK(is_fp8(g.ab_type) && is_fp8(bt), "gemm: FP8 product with A {} and B {}", dtype_name(g.ab_type),
                dtype_name(bt));
  LMSCALE_CHECK(!(g.ab_type == DType::e5m2 && bt == DType::e5m2), "gemm: FP8 operands may not both be fp8_e5m2");
  LMSCALE_CHECK(g.trans_a && !g.trans_b, "gemm: FP8 products need the TN layout (A transposed, B not)");
  LMSCALE_CHECK(g.c_type == DType::bf16 || g.c_type == DType::f32, "gemm: FP8 product writing {} (bf16 or fp32)",
                dtype_name(g.c_type));
  LMSCALE_CHECK(g.k % 16 == 0 && g.lda % 16 == 0 && g.ldb % 16 == 0,
                "gemm: FP8 product with k={}, lda={}, ldb={}: each must be a multiple of 16", g.k, g.lda, g.ldb);
  LMSCALE_CHECK(alignment(g.a) >= 16 && alignment(g.b) >= 16 && alignment(g.c) >= 16,
                "gemm: FP8 product operands must be 16-byte aligned (A {}, B {}, C {})", g.a, g.b,
                static_cast<const void*>(g.c));
  LMSCALE_CHECK(g.batch == 1, "gemm: batched FP8 products are not supported");
}

// FP8 tensor cores start with compute capability 8.9 (Ada; Hopper is 9.0). Asked once per new
// plan, so an older GPU gets this message rather than cuBLASLt's "not supported".
void require_fp8_tensor_cores(int device) {
  int major = 0, minor = 0;
  LMSCALE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  LMSCALE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  LMSCALE_CHECK(major * 10 + minor >= 89,
                "gemm: FP8 products need FP8 tensor cores (compute capability 8.9 or newer; Hopper is 9.0), "
                "device {} is {}.{}",
                device, major, minor);
}

}  // namespace

struct GemmPlanCache::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
  bool one_by_one = false;     // a strided batch cuBLASLt has no algorithm for: run its products singly
  bool no_algorithm = false;   // the heuristic found nothing (heuristic_status says why)
  cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

GemmPlanCache::GemmPlanCache() = default;
GemmPlanCache::~GemmPlanCache() = default;

std::size_t GemmPlanCache::size() const {
  std::size_t n = plans.size();
  for (const auto& [key, sc] : classes) n += sc.plan ? 1 : 0;
  return n;
}

std::int64_t shape_class_dim(std::int64_t x) {
  if (x <= 1) return x;
  if (x <= 256) {
    std::int64_t p = 1;
    while (p < x) p <<= 1;
    return p;
  }
  return (x + 255) / 256 * 256;
}

std::size_t GemmPlanCache::KeyHash::operator()(const Key& k) const {
  std::size_t h = 1469598103934665603ull;
  for (std::int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, static_cast<std::int64_t>(k.flags), k.batch, k.stride_a,
                         k.stride_b, k.stride_c, static_cast<std::int64_t>(k.sm_target)})
    h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull;
  return h;
}

namespace {

// Bytes an operand spans: `cols` columns of leading dimension ld, per matrix of the batch.
std::size_t span_bytes(std::int64_t ld, std::int64_t cols, const GemmArgs& g, std::int64_t stride, DType t) {
  return static_cast<std::size_t>(ld * cols + (g.batch > 1 ? (g.batch - 1) * stride : 0)) * dtype_size(t);
}
bool overlap(const void* p, std::size_t pn, const void* q, std::size_t qn) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
  return a < b + qn && b < a + pn;
}

// The FP8 operands' dequantisation factors (device pointers to one fp32 each; null means 1).
void set_scale_pointers(cublasLtMatmulDesc_t desc, const GemmArgs& g) {
  LMSCALE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof(g.a_scale)));
  LMSCALE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof(g.b_scale)));
}

// An FP8 plan's accumulation (GemmArgs::fast_accum), written both ways rather than left at
// cuBLASLt's default (0, promoted), so a plan says what it was made for. Set before the heuristic
// query and the autotuning, which then pick and time algorithms for this mode: the fast and the
// promoted kernels differ.
void set_fast_accum(cublasLtMatmulDesc_t desc, bool fast) {
  const std::int8_t mode = fast ? 1 : 0;
  LMSCALE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &mode, sizeof(mode)));
}

// Autotuning (Resources::gemm_autotune): times each candidate algorithm on the real operands and
// returns the index of the fastest (median of 3 runs after one warm-up). Runs once per plan. With
// beta = 0 the candidates write the caller's C, which the real product overwrites next (no
// scratch: the tuning step's memory is the steady state's, so the memory model stays exact); with
// beta != 0 they write a scratch C, since C holds what the product accumulates into.
int fastest(Resources& r, const GemmPlanCache::Plan& p, const GemmArgs& g, const cublasLtMatmulHeuristicResult_t* res,
            int count) {
  const std::size_t c_bytes = span_bytes(g.ldc, g.n, g, g.stride_c, g.c_type);
  const bool in_place = g.beta == 0.f &&
                        !overlap(g.c, c_bytes, g.a, span_bytes(g.lda, g.trans_a ? g.m : g.k, g, g.stride_a, g.ab_type)) &&
                        !overlap(g.c, c_bytes, g.b,
                                 span_bytes(g.ldb, g.trans_b ? g.k : g.n, g, g.stride_b, g.b_type.value_or(g.ab_type)));
  void* c = in_place ? g.c : r.alloc->allocate(c_bytes, "gemm_autotune");
  if (!in_place) LMSCALE_CUDA_CHECK(cudaMemsetAsync(c, 0, c_bytes, r.stream));
  cudaEvent_t e0, e1;
  LMSCALE_CUDA_CHECK(cudaEventCreate(&e0));
  LMSCALE_CUDA_CHECK(cudaEventCreate(&e1));
  int best = -1;
  float best_ms = 0;
  for (int i = 0; i < count; ++i) {
    auto run = [&] {
      return cublasLtMatmul(r.lt, p.desc, &g.alpha, g.a, p.a, g.b, p.b, &g.beta, c, p.c, c, p.c, &res[i].algo,
                            r.workspace, r.workspace_bytes, r.stream);
    };
    if (res[i].state != CUBLAS_STATUS_SUCCESS || run() != CUBLAS_STATUS_SUCCESS) continue;
    float ms[3];
    for (float& m : ms) {
      LMSCALE_CUDA_CHECK(cudaEventRecord(e0, r.stream));
      run();
      LMSCALE_CUDA_CHECK(cudaEventRecord(e1, r.stream));
      LMSCALE_CUDA_CHECK(cudaEventSynchronize(e1));
      LMSCALE_CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
    }
    std::sort(ms, ms + 3);
    if (best < 0 || ms[1] < best_ms) best = i, best_ms = ms[1];
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  LMSCALE_CUDA_CHECK(cudaStreamSynchronize(r.stream));
  if (!in_place) r.alloc->deallocate(c, c_bytes, "gemm_autotune");
  return best < 0 ? 0 : best;
}

// The dims a plan's layouts describe: the call's own, or its shape class's representative.
struct LayoutDims {
  std::int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c;
};

LayoutDims exact_dims(const GemmArgs& g) {
  const bool batched = g.batch > 1;
  return {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, batched ? g.stride_a : 0, batched ? g.stride_b : 0,
          batched ? g.stride_c : 0};
}

// A leading dimension (or batch stride) v grown to at least `need` by a multiple of 256 elements,
// so its alignment (which an algorithm may depend on, like the pointers') stays the call's.
std::int64_t grown(std::int64_t v, std::int64_t need) { return v >= need ? v : v + (need - v + 255) / 256 * 256; }

// The representative shape of g's class (gemm.h): m, n, k rounded up by shape_class_dim, the
// leading dimensions and non-zero batch strides grown to hold the larger matrices.
LayoutDims representative_dims(const GemmArgs& g) {
  const LayoutDims e = exact_dims(g);
  LayoutDims d = e;
  d.m = shape_class_dim(e.m), d.n = shape_class_dim(e.n), d.k = shape_class_dim(e.k);
  d.lda = grown(e.lda, g.trans_a ? d.k : d.m);
  d.ldb = grown(e.ldb, g.trans_b ? d.n : d.k);
  d.ldc = grown(e.ldc, d.m);
  if (e.stride_a != 0) d.stride_a = grown(e.stride_a, d.lda * (g.trans_a ? d.m : d.k));
  if (e.stride_b != 0) d.stride_b = grown(e.stride_b, d.ldb * (g.trans_b ? d.k : d.n));
  if (e.stride_c != 0) d.stride_c = grown(e.stride_c, d.ldc * d.n);
  return d;
}

// The class of an exact key: m, n, k rounded up, batch strides only zero (a shared operand) or
// not; leading dimensions stay exact (in the products ops::linear makes a varying row count is
// a layout's column count, never a leading dimension).
GemmPlanCache::Key class_key(GemmPlanCache::Key k) {
  k.m = shape_class_dim(k.m), k.n = shape_class_dim(k.n), k.k = shape_class_dim(k.k);
  k.stride_a = k.stride_a != 0, k.stride_b = k.stride_b != 0, k.stride_c = k.stride_c != 0;
  return k;
}

// Stored shapes (column-major): A is m x k (k x m when transposed), B is k x n (n x k), C m x n.
void create_layouts(GemmPlanCache::Plan& p, const GemmArgs& g, DType bt, const LayoutDims& d) {
  LMSCALE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(g.ab_type), g.trans_a ? d.k : d.m,
                                                  g.trans_a ? d.m : d.k, d.lda));
  LMSCALE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.b, cuda_type(bt), g.trans_b ? d.n : d.k, g.trans_b ? d.k : d.n, d.ldb));
  LMSCALE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(g.c_type), d.m, d.n, d.ldc));
  if (g.batch > 1) {
    const std::int32_t count = g.batch;
    for (auto [layout, stride] : {std::pair{p.a, d.stride_a}, std::pair{p.b, d.stride_b}, std::pair{p.c, d.stride_c}}) {
      LMSCALE_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      LMSCALE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                            &stride, sizeof(stride)));
    }
  }
}

// Sets the layouts made by create_layouts to dims d (host-side attributes: cuBLASLt reads them
// when a product is queued, so a class plan serves each call with that call's exact shape).
void set_layout_dims(GemmPlanCache::Plan& p, const GemmArgs& g, const LayoutDims& d) {
  auto set = [](cublasLtMatrixLayout_t l, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t stride,
                bool batched) {
    const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
    LMSCALE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
    LMSCALE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
    LMSCALE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld)));
    if (batched)
      LMSCALE_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  };
  const bool batched = g.batch > 1;
  set(p.a, g.trans_a ? d.k : d.m, g.trans_a ? d.m : d.k, d.lda, d.stride_a, batched);
  set(p.b, g.trans_b ? d.n : d.k, g.trans_b ? d.k : d.n, d.ldb, d.stride_b, batched);
  set(p.c, d.m, d.n, d.ldc, d.stride_c, batched);
}

// What a new plan is made for: the call's compute mode (fast_accum: FP8's fast accumulation), B's
// dtype, the operands' alignments, whether to time candidates, and the plan whose algorithm an
// accumulating product reuses.
struct PlanRequest {
  bool tf32 = false, fp8 = false, fast_accum = false;
  DType bt = DType::f32;
  std::uint32_t al_a = 1, al_b = 1, al_c = 1;
  bool tune = false;
  const GemmPlanCache::Plan* twin = nullptr;
};

// A plan whose layouts have dims d (the call's, or its class's representative) and whose
// algorithm is the heuristic's first for d, or (tuning) the fastest of its candidates on the
// call's operands and exact shape. no_algorithm when the heuristic has none for d.
std::unique_ptr<GemmPlanCache::Plan> make_plan(Resources& r, const GemmArgs& g, const LayoutDims& d,
                                               const PlanRequest& q) {
  auto plan = std::make_unique<GemmPlanCache::Plan>();
  ++r.gemm_plans.plans_made;
  const cublasComputeType_t compute = q.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LMSCALE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LMSCALE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LMSCALE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // parallel.comm_sms: NCCL holds some SMs while this product may run; a plan for all of them
  // would leave its last wave (or a persistent kernel's CTAs) waiting for the collective.
  if (r.gemm_sm_target > 0)
    LMSCALE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                        &r.gemm_sm_target, sizeof(r.gemm_sm_target)));
  if (q.fp8) {
    set_scale_pointers(plan->desc, g);
    set_fast_accum(plan->desc, q.fast_accum);
  }
  create_layouts(*plan, g, q.bt, d);
  // beta is a call argument, not part of the plan: an accumulating product takes the algorithm
  // its overwriting twin (the same shape, tuned in place) chose, without a scratch C.
  if (q.twin && !q.twin->one_by_one && !q.twin->no_algorithm) {
    plan->algo = q.twin->algo;
    plan->workspace = q.twin->workspace;
    return plan;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  LMSCALE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = r.workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &q.al_a, sizeof(q.al_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &q.al_b, sizeof(q.al_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &q.al_c, sizeof(q.al_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &q.al_c, sizeof(q.al_c));
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(r.lt, plan->desc, plan->a, plan->b, plan->c, plan->c, pref,
                                                          q.tune ? kCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    plan->no_algorithm = true;
    plan->heuristic_status = s;
    return plan;
  }
  int best = 0;
  if (found > 1) {
    set_layout_dims(*plan, g, exact_dims(g));   // time the candidates on the call's own shape
    best = fastest(r, *plan, g, results, found);
  }
  plan->algo = results[best].algo;
  plan->workspace = results[best].workspaceSize;
  return plan;
}

// Runs g on an exact plan (or its products singly, for a batch without an algorithm).
void run_exact(Resources& r, bool allow_tf32, GemmPlanCache::Plan& p, const GemmArgs& g, bool fp8) {
  // The scale pointers are the call's, not the plan's: set them on the cached descriptor (a host
  // object; cuBLASLt reads it when the product is queued).
  if (fp8) set_scale_pointers(p.desc, g);
  if (p.one_by_one) {
    const auto ab = static_cast<std::ptrdiff_t>(dtype_size(g.ab_type)), cb = static_cast<std::ptrdiff_t>(dtype_size(g.c_type));
    for (int i = 0; i < g.batch; ++i) {
      GemmArgs one = g;
      one.batch = 1;
      one.a = static_cast<const char*>(g.a) + i * g.stride_a * ab;
      one.b = static_cast<const char*>(g.b) + i * g.stride_b * ab;
      one.c = static_cast<char*>(g.c) + i * g.stride_c * cb;
      gemm(r, allow_tf32, one);
    }
    return;
  }
  LMSCALE_CUBLAS_CHECK(cublasLtMatmul(r.lt, p.desc, &g.alpha, g.a, p.a, g.b, p.b, &g.beta, g.c, p.c, g.c, p.c, &p.algo,
                                      r.workspace, r.workspace_bytes, r.stream));
}

// Runs g on its class's plan, its layouts set to g's exact dims, if the class's algorithm
// supports that shape within the workspace; false (nothing queued) when it does not.
bool run_on_class_plan(Resources& r, GemmPlanCache::Plan& p, const GemmArgs& g, bool fp8) {
  if (p.no_algorithm) return false;
  set_layout_dims(p, g, exact_dims(g));
  if (fp8) set_scale_pointers(p.desc, g);
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(r.lt, p.desc, p.a, p.b, p.c, p.c, &p.algo, &check) != CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > r.workspace_bytes)
    return false;
  const cublasStatus_t s = cublasLtMatmul(r.lt, p.desc, &g.alpha, g.a, p.a, g.b, p.b, &g.beta, g.c, p.c, g.c, p.c,
                                          &p.algo, r.workspace, r.workspace_bytes, r.stream);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return false;   // refused before anything was queued
  LMSCALE_CUBLAS_CHECK(s);
  return true;
}

// What the key needs beyond GemmArgs: B's dtype, tf32 and the operands' alignments (gemm() needs
// them for the checks and the plan request too, so they are worked out once).
struct KeyInputs {
  DType bt;
  bool tf32;
  std::uint32_t al_a, al_b, al_c;
};
KeyInputs key_inputs(const GemmArgs& g, bool allow_tf32) {
  const DType bt = g.b_type.value_or(g.ab_type);
  const bool batched = g.batch > 1;
  return {bt, allow_tf32 && g.ab_type == DType::f32, batch_alignment(g.a, batched ? g.stride_a : 0, g.ab_type),
          batch_alignment(g.b, batched ? g.stride_b : 0, bt), batch_alignment(g.c, batched ? g.stride_c : 0, g.c_type)};
}

// The key of g. Bits of flags: 0 trans_a, 1 trans_b, 2 tf32, 3 beta != 0 (kBetaFlag), 4-7 A's
// dtype, 8-11 C's, 12-15 / 16-19 / 20-23 log2 of A's / B's / C's alignment, 24-31 B's dtype,
// 32 fast_accum.
GemmPlanCache::Key key_of(const GemmArgs& g, const KeyInputs& in, std::int32_t sm_target) {
  const bool batched = g.batch > 1;
  const std::uint64_t flags = (g.trans_a ? 1u : 0u) | (g.trans_b ? 2u : 0u) | (in.tf32 ? 4u : 0u) |
                              (g.beta != 0.f ? 8u : 0u) | (static_cast<std::uint32_t>(g.ab_type) << 4) |
                              (static_cast<std::uint32_t>(g.c_type) << 8) | (log2u(in.al_a) << 12) |
                              (log2u(in.al_b) << 16) | (log2u(in.al_c) << 20) |
                              (static_cast<std::uint32_t>(in.bt) << 24) | (std::uint64_t{g.fast_accum} << 32);
  return {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, flags, g.batch, batched ? g.stride_a : 0, batched ? g.stride_b : 0,
          batched ? g.stride_c : 0, sm_target};
}

}  // namespace

GemmPlanCache::Key gemm_plan_key(const GemmArgs& g, bool allow_tf32, std::int32_t sm_target) {
  return key_of(g, key_inputs(g, allow_tf32), sm_target);
}

void gemm(Resources& r, bool allow_tf32, const GemmArgs& g) {
  // Only arithmetic on the arguments (nothing throws): worked out before the checks, which need bt.
  const KeyInputs in = key_inputs(g, allow_tf32);
  const DType bt = in.bt;
  const bool fp8 = is_fp8(g.ab_type) || is_fp8(bt);
  // Fast accumulation is a mode of cuBLASLt's FP8 kernels alone; on another product the attribute
  // would be ignored silently, so a caller asking for it there has made a mistake.
  LMSCALE_CHECK(fp8 || !g.fast_accum,
                "gemm: fast_accum (CUBLASLT_MATMUL_DESC_FAST_ACCUM) applies to FP8 products only, but A is {} and B "
                "is {}",
                dtype_name(g.ab_type), dtype_name(bt));
  if (fp8) {
    check_fp8(g, bt);
  } else {
    LMSCALE_CHECK(bt == g.ab_type, "gemm: A is {} but B is {}", dtype_name(g.ab_type), dtype_name(bt));
    LMSCALE_CHECK(g.c_type == g.ab_type || g.c_type == DType::f32, "gemm: output dtype {} with {} inputs",
                  dtype_name(g.c_type), dtype_name(g.ab_type));
  }
  if (g.m == 0 || g.n == 0) return;
  LMSCALE_CHECK(g.batch >= 1, "gemm: batch {}", g.batch);
  const bool batched = g.batch > 1;
  const GemmPlanCache::Key key = key_of(g, in, r.gemm_sm_target);
  GemmPlanCache& cache = r.gemm_plans;
  if (const auto it = cache.plans.find(key); it != cache.plans.end())
    return run_exact(r, allow_tf32, *it->second, g, fp8);
  if (fp8) require_fp8_tensor_cores(r.device);
  constexpr std::uint64_t kBetaFlag = 8u;   // the key's beta != 0 bit: an accumulating twin differs in it alone
  PlanRequest q{in.tf32, fp8, g.fast_accum, bt, in.al_a, in.al_b, in.al_c, r.gemm_autotune, nullptr};
  // A new exact shape: its class's plan once the class has seen kExactShapesBeforeClassPlan
  // shapes, or at once where the caller says the shapes vary (gemm.h); map references stay valid
  // while the recursion of run_exact inserts.
  const GemmPlanCache::Key ckey = class_key(key);
  GemmPlanCache::ShapeClass& sc = cache.classes[ckey];
  if (uses_class_plan(sc.exact_plans, r.gemm_shapes_vary)) {
    if (!sc.plan) {
      GemmPlanCache::Key twin_key = ckey;
      twin_key.flags &= ~kBetaFlag;
      const auto twin = g.beta != 0.f ? cache.classes.find(twin_key) : cache.classes.end();
      q.twin = twin != cache.classes.end() ? twin->second.plan.get() : nullptr;
      sc.plan = make_plan(r, g, representative_dims(g), q);
    }
    if (run_on_class_plan(r, *sc.plan, g, fp8)) {
      ++cache.class_products;
      return;
    }
    ++cache.class_fallbacks;
  }
  // An exact plan: kept while its class holds fewer than kExactPlansPerClass, else used once
  // (untuned: it is made again on each such call) so the cache stays bounded.
  const bool keep = sc.exact_plans < kExactPlansPerClass;
  GemmPlanCache::Key twin_key = key;
  twin_key.flags &= ~kBetaFlag;
  const auto twin = g.beta != 0.f ? cache.plans.find(twin_key) : cache.plans.end();
  q.twin = twin != cache.plans.end() ? twin->second.get() : nullptr;
  q.tune = r.gemm_autotune && keep;
  std::unique_ptr<GemmPlanCache::Plan> plan = make_plan(r, g, exact_dims(g), q);
  if (plan->no_algorithm) {
    if (!batched)
      throw Error(fmt::format("gemm: cuBLASLt has no algorithm for m={} n={} k={} {}x{}->{} ({})", g.m, g.n, g.k,
                              dtype_name(g.ab_type), dtype_name(bt), dtype_name(g.c_type),
                              status_name(plan->heuristic_status)));
    plan->no_algorithm = false;
    plan->one_by_one = true;
  }
  if (!keep) return run_exact(r, allow_tf32, *plan, g, fp8);
  ++sc.exact_plans;
  GemmPlanCache::Plan& p = *cache.plans.emplace(key, std::move(plan)).first->second;
  run_exact(r, allow_tf32, p, g, fp8);
}

}  // namespace lmscale::ops::cuda
