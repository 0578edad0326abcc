// Naive attention on CUDA: the score matrix of every head is materialised in the input dtype
// (probs [B,H,T,T]), as an eager PyTorch implementation does. Products through cuBLASLt
// strided-batched GEMMs (fp32 accumulation; fp32 inputs use TF32 only when ctx.allow_tf32);
// softmax and its backward in own kernels with fp32 math, one block per row (attention_naive.cu).
//
// cuBLAS is column-major: a row-major [T, D] head with row stride ld is the column-major D x T
// matrix X^c with leading dimension ld, and a row-major T x T matrix P is (P^T)^c. So
//   S^c   = K^c^T Q^c      (m=T, n=T, k=D)      O^c  = V^c P^c        (m=D, n=T, k=T)
//   dV^c  = dO^c P^c^T     (m=D, n=T, k=T)      dP^c = V^c^T dO^c     (m=T, n=T, k=D)
//   dQ^c  = scale K^c dS^c (m=D, n=T, k=T)      dK^c = scale Q^c dS^c^T (m=D, n=T, k=T)
#include <optional>

#include "lmscale/core/nvtx.h"
#include <cublasLt.h>

#include <cstdint>

#include "attention_cuda.h"
#include "attention_kernels.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

#define LMSCALE_LT_CHECK(expr)                                                                          \
  do {                                                                                                  \
    cublasStatus_t _s = (expr);                                                                         \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                                    \
      throw ::lmscale::Error(fmt::format("{}:{}: {} failed: status {}", __FILE__, __LINE__, #expr, static_cast<int>(_s))); \
  } while (0)

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: throw Error(fmt::format("naive attention on CUDA: dtype {} not supported", dtype_name(d)));
  }
}

// One column-major operand of a batched GEMM.
struct Operand {
  const void* ptr;
  std::int64_t ld, stride;   // leading dimension and batch stride, in elements
};

// C = alpha op(A) op(B) + beta C for `batch` matrices, column-major, all in dtype `d`.
void gemm_batched(Context& ctx, DType d, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  Operand A, Operand B, float beta, void* C, std::int64_t ldc, std::int64_t stride_c, int batch) {
  Resources& r = resources(ctx);
  const cudaDataType_t dt = cuda_type(d);
  const cublasComputeType_t compute =
      d == DType::f32 && ctx.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  struct Cleanup {
    cublasLtMatmulDesc_t& op;
    cublasLtMatrixLayout_t &la, &lb, &lc;
    cublasLtMatmulPreference_t& pref;
    ~Cleanup() {
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      if (lc) cublasLtMatrixLayoutDestroy(lc);
      if (lb) cublasLtMatrixLayoutDestroy(lb);
      if (la) cublasLtMatrixLayoutDestroy(la);
      if (op) cublasLtMatmulDescDestroy(op);
    }
  } cleanup{op, la, lb, lc, pref};
  LMSCALE_LT_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LMSCALE_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  LMSCALE_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  auto layout = [&](cublasLtMatrixLayout_t& l, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t stride) {
    LMSCALE_LT_CHECK(cublasLtMatrixLayoutCreate(&l, dt, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
    LMSCALE_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    LMSCALE_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  };
  layout(la, ta ? k : m, ta ? m : k, A.ld, A.stride);
  layout(lb, tb ? n : k, tb ? k : n, B.ld, B.stride);
  layout(lc, m, n, ldc, stride_c);
  LMSCALE_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::uint64_t ws = r.workspace_bytes;
  LMSCALE_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  LMSCALE_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(r.lt, op, la, lb, lc, lc, pref, 1, &heur, &found));
  LMSCALE_CHECK(found > 0, "naive attention: cuBLASLt found no algorithm for {}x{}x{} batch {}", m, n, k, batch);
  LMSCALE_LT_CHECK(cublasLtMatmul(r.lt, op, &alpha, A.ptr, la, B.ptr, lb, &beta, C, lc, C, lc, &heur.algo, r.workspace,
                                  r.workspace_bytes, stream(ctx)));
}

// Runs f(b0, nb) over groups of heads that one strided-batched call can cover: all B*H heads at
// once when stride_b == H*stride_h in both layouts (q, k, v's and o, dO's), else one call per
// batch row. A group's first head is at b0*stride_b (b0*o_stride_b for o and dO).
template <class F>
void for_head_groups(const AttentionShape& s, F&& f) {
  if (s.stride_b == s.heads * s.stride_h && s.o_stride_b == s.heads * s.o_stride_h) {
    f(std::int64_t{0}, s.batch * s.heads);
  } else {
    for (std::int64_t b = 0; b < s.batch; ++b) f(b, s.heads);
  }
}

attn::Elem elem(DType d) {
  return d == DType::f32 ? attn::Elem::f32 : d == DType::bf16 ? attn::Elem::bf16 : attn::Elem::f16;
}
std::size_t esize(DType d) { return dtype_size(d); }
const char* at(const void* p, std::int64_t elems, DType d) {
  return static_cast<const char*>(p) + elems * static_cast<std::int64_t>(esize(d));
}

}  // namespace

void attention_naive_forward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                             const void* v, void* o, void* probs) {
  const std::int64_t T = s.seq, D = s.head_dim, ld = s.stride_t, ldo = s.o_stride_t, TT = T * T;
  const float scale = static_cast<float>(s.softmax_scale());
  // NVTX ranges mark the three stages in Nsight Systems timelines, as in the seed's profiles.
  std::optional<NvtxRange> range(std::in_place, "scores");
  for_head_groups(s, [&](std::int64_t b, std::int64_t nb) {
    const std::int64_t off = b * s.stride_b;            // first head of the group
    const std::int64_t poff = b * s.heads * TT;         // its probs
    const int batch = static_cast<int>(nb);
    void* P = const_cast<char*>(at(probs, poff, dtype));
    // S^c = scale * K^c^T Q^c
    gemm_batched(ctx, dtype, true, false, T, T, D, scale, {at(k, off, dtype), ld, s.stride_h},
                 {at(q, off, dtype), ld, s.stride_h}, 0.f, P, T, TT, batch);
  });
  const long long rows = s.batch * s.heads * T;
  range.emplace("softmax");
  attn::launch_naive_softmax(elem(dtype), stream(ctx), probs, rows, T, s.causal);
  range.emplace("weighted_sum");
  for_head_groups(s, [&](std::int64_t b, std::int64_t nb) {
    const std::int64_t off = b * s.stride_b, ooff = b * s.o_stride_b, poff = b * s.heads * TT;
    // O^c = V^c P^c
    gemm_batched(ctx, dtype, false, false, D, T, T, 1.f, {at(v, off, dtype), ld, s.stride_h},
                 {at(probs, poff, dtype), T, TT}, 0.f, const_cast<char*>(at(o, ooff, dtype)), ldo, s.o_stride_h,
                 static_cast<int>(nb));
  });
}

void attention_naive_backward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                              const void* v, const void* probs, const void* dout, void* dq, void* dk, void* dv) {
  const std::int64_t T = s.seq, D = s.head_dim, ld = s.stride_t, ldo = s.o_stride_t, TT = T * T;
  const float scale = static_cast<float>(s.softmax_scale());
  Allocator& alloc = *ctx.allocator;
  const std::size_t dp_bytes = static_cast<std::size_t>(s.batch * s.heads * TT) * esize(dtype);
  void* dP = alloc.allocate(dp_bytes, "attention_naive_dp");   // dP, then dS in place  [B,H,T,T]
  struct Free {
    Allocator& a;
    void* ptr;
    std::size_t bytes;
    ~Free() { a.deallocate(ptr, bytes, "attention_naive_dp"); }
  } guard{alloc, dP, dp_bytes};
  for_head_groups(s, [&](std::int64_t b, std::int64_t nb) {
    const std::int64_t off = b * s.stride_b, ooff = b * s.o_stride_b, poff = b * s.heads * TT;
    const int batch = static_cast<int>(nb);
    // dV^c = dO^c P^c^T
    gemm_batched(ctx, dtype, false, true, D, T, T, 1.f, {at(dout, ooff, dtype), ldo, s.o_stride_h},
                 {at(probs, poff, dtype), T, TT}, 0.f, const_cast<char*>(at(dv, off, dtype)), ld, s.stride_h, batch);
    // dP^c = V^c^T dO^c
    gemm_batched(ctx, dtype, true, false, T, T, D, 1.f, {at(v, off, dtype), ld, s.stride_h},
                 {at(dout, ooff, dtype), ldo, s.o_stride_h}, 0.f, const_cast<char*>(at(dP, poff, dtype)), T, TT,
                 batch);
  });
  const long long rows = s.batch * s.heads * T;
  attn::launch_naive_softmax_backward(elem(dtype), stream(ctx), probs, dP, rows, T);
  for_head_groups(s, [&](std::int64_t b, std::int64_t nb) {
    const std::int64_t off = b * s.stride_b, poff = b * s.heads * TT;
    const int batch = static_cast<int>(nb);
    // dQ^c = scale K^c dS^c ; dK^c = scale Q^c dS^c^T
    gemm_batched(ctx, dtype, false, false, D, T, T, scale, {at(k, off, dtype), ld, s.stride_h},
                 {at(dP, poff, dtype), T, TT}, 0.f, const_cast<char*>(at(dq, off, dtype)), ld, s.stride_h, batch);
    gemm_batched(ctx, dtype, false, true, D, T, T, scale, {at(q, off, dtype), ld, s.stride_h},
                 {at(dP, poff, dtype), T, TT}, 0.f, const_cast<char*>(at(dk, off, dtype)), ld, s.stride_h, batch);
  });
}

}  // namespace lmscale::ops::cuda
