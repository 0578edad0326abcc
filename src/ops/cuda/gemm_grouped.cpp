// gemm_grouped (gemm_grouped.h): pointer arrays from the products' offsets, then one
// cublasGemmGroupedBatchedEx, or the loop of gemm() calls where cuBLAS cannot group.
#include "gemm_grouped.h"

#include <fmt/format.h>

#include <climits>
#include <cstdint>

#include "gemm.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

cudaDataType_t blas_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: throw Error(fmt::format("gemm_grouped: dtype {}", dtype_name(t)));
  }
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("gemm_grouped: {} failed: {}", what, cublasGetStatusName(s)));
}

// The cuBLAS handle, made on first use, bound to the resources' stream, workspace and SM target.
cublasHandle_t blas_handle(Resources& r) {
  if (!r.blas) {
    check_blas(cublasCreate(&r.blas), "cublasCreate");
    check_blas(cublasSetPointerMode(r.blas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  }
  // The stream first: cublasSetStream resets the handle's workspace to cuBLAS's own pool.
  check_blas(cublasSetStream(r.blas, r.stream), "cublasSetStream");
  check_blas(cublasSetWorkspace(r.blas, r.workspace, r.workspace_bytes), "cublasSetWorkspace");
  // parallel.comm_sms: as the cuBLASLt plans (gemm.cpp), leave the collectives' SMs alone.
  check_blas(cublasSetSmCountTarget(r.blas, r.gemm_sm_target), "cublasSetSmCountTarget");
  return r.blas;
}

bool fits_int(std::int64_t v) { return v >= 0 && v <= INT_MAX; }

// Problem i as one gemm() call.
GemmArgs problem_args(const detail::GroupedProducts& p, const detail::GroupedProducts::Group& grp,
                      const detail::GroupedProducts::Problem& pr, const GroupedOperands& o) {
  const auto esa = static_cast<std::ptrdiff_t>(dtype_size(o.ab_type)), esc = static_cast<std::ptrdiff_t>(dtype_size(o.c_type));
  GemmArgs g;
  g.trans_a = p.trans_a, g.trans_b = p.trans_b;
  g.m = grp.m, g.n = grp.n, g.k = grp.k;
  g.a = static_cast<const char*>(o.a[static_cast<std::size_t>(pr.copy)]) + pr.a * esa, g.lda = grp.lda;
  g.b = static_cast<const char*>(o.b[static_cast<std::size_t>(pr.copy)]) + pr.b * esa, g.ldb = grp.ldb;
  g.c = static_cast<char*>(o.c[static_cast<std::size_t>(pr.copy)]) + pr.c * esc, g.ldc = grp.ldc;
  g.ab_type = o.ab_type, g.c_type = o.c_type;
  g.alpha = p.alpha, g.beta = p.beta;
  return g;
}

}  // namespace

bool groupable_dtypes(DType ab_type, DType c_type) {
  return ab_type == c_type && (ab_type == DType::f32 || ab_type == DType::bf16 || ab_type == DType::f16);
}

GemmShapesVary::GemmShapesVary(Resources& r) : r_(&r), before_(r.gemm_shapes_vary) { r.gemm_shapes_vary = true; }
GemmShapesVary::GemmShapesVary(Context& ctx) : GemmShapesVary(*static_cast<Resources*>(ctx.cuda)) {}
GemmShapesVary::~GemmShapesVary() { r_->gemm_shapes_vary = before_; }

void gemm_grouped(Resources& r, bool allow_tf32, const detail::GroupedProducts& p, const GroupedOperands& o) {
  if (p.problems.empty()) return;
  for (const auto& pr : p.problems)
    LMSCALE_CHECK(static_cast<std::size_t>(pr.copy) < o.a.size() && static_cast<std::size_t>(pr.copy) < o.b.size() &&
                      static_cast<std::size_t>(pr.copy) < o.c.size(),
                  "gemm_grouped: problem of copy {} but {} operand copies", pr.copy, o.a.size());
  // Problems with their groups' dims and their operands' pointers (Aarray, Barray, Carray in one
  // device array of 3 P words).
  const std::size_t P = p.problems.size();
  std::vector<const void*> pointers(3 * P);
  std::vector<GemmArgs> args;
  args.reserve(P);
  bool grouped = groupable_dtypes(o.ab_type, o.c_type);
  std::size_t i = 0;
  for (const auto& grp : p.groups) {
    for (std::int64_t v : {grp.m, grp.n, grp.k, grp.lda, grp.ldb, grp.ldc}) grouped = grouped && fits_int(v);
    for (int j = 0; j < grp.size; ++j, ++i) {
      const GemmArgs g = problem_args(p, grp, p.problems[i], o);
      pointers[i] = g.a, pointers[P + i] = g.b, pointers[2 * P + i] = g.c;
      // cuBLAS's rule for 16-bit inputs (its documentation of cublasGemmGroupedBatchedEx): 16-byte
      // aligned matrices, or alignments that depend on k; the loop takes any.
      for (const void* ptr : {g.a, g.b, static_cast<const void*>(g.c)})
        grouped = grouped && reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
      args.push_back(g);
    }
  }
  LMSCALE_CHECK(i == P, "gemm_grouped: groups hold {} problems, the list {}", i, P);
  if (!grouped) {
    const GemmShapesVary vary(r);
    for (const GemmArgs& g : args) gemm(r, allow_tf32, g);
    r.grouped_gemm.looped_products += static_cast<std::int64_t>(P);
    return;
  }
  // Per group: transposes, dims, scalars (host arrays, read by cuBLAS during the call).
  const std::size_t G = p.groups.size();
  std::vector<cublasOperation_t> ta(G, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N), tb(G, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  std::vector<int> m(G), n(G), k(G), lda(G), ldb(G), ldc(G), size(G);
  std::vector<float> alpha(G, p.alpha), beta(G, p.beta);
  for (std::size_t q = 0; q < G; ++q) {
    const auto& grp = p.groups[q];
    m[q] = static_cast<int>(grp.m), n[q] = static_cast<int>(grp.n), k[q] = static_cast<int>(grp.k);
    lda[q] = static_cast<int>(grp.lda), ldb[q] = static_cast<int>(grp.ldb), ldc[q] = static_cast<int>(grp.ldc);
    size[q] = grp.size;
  }
  // The pointer arrays live until the product has run: a stream-ordered free (resources.h).
  const std::size_t bytes = pointers.size() * sizeof(void*);
  void* device = r.alloc->allocate(bytes, "gemm_grouped_pointers");
  struct Free {
    Resources& r;
    void* p;
    std::size_t bytes;
    ~Free() { r.alloc->deallocate(p, bytes, "gemm_grouped_pointers"); }
  } free_at_exit{r, device, bytes};
  const auto** dev = static_cast<const void**>(device);
  store_pointers(pointers.data(), pointers.size(), dev, r.stream);
  void* const* dev_c = static_cast<void* const*>(device) + 2 * P;   // Carray: the same words, as writable matrices
  const cublasComputeType_t compute =
      allow_tf32 && o.ab_type == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t ab = blas_type(o.ab_type), c = blas_type(o.c_type);
  check_blas(cublasGemmGroupedBatchedEx(blas_handle(r), ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
                                        dev, ab, lda.data(), dev + P, ab, ldb.data(), beta.data(),
                                        dev_c, c,
                                        ldc.data(), static_cast<int>(G), size.data(), compute),
             "cublasGemmGroupedBatchedEx");
  ++r.grouped_gemm.calls;
  r.grouped_gemm.products += static_cast<std::int64_t>(P);
}

}  // namespace lmscale::ops::cuda
