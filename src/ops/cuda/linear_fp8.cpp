// ops::linear_fp8 on cuBLASLt (gemm.h). y[M,N] = (a[M,K] a_inv) (b[N,K] b_inv)^T with row-major
// a, b, y read as column-major matrices: a is A' = K x M (ld K), b is B' = K x N (ld K), y is
// y^T = N x M (ld N), so
//   y^T = B'^T A'
// is cuBLASLt's "TN" product (its A = b transposed, its B = a as stored), the one layout Hopper's
// FP8 kernels take. cuBLASLt's A scale is b_inv and its B scale a_inv. Fp8Accumulation::fast sets
// the plan's CUBLASLT_MATMUL_DESC_FAST_ACCUM (GemmArgs::fast_accum; docs/precision.md).
#include <cstdint>
#include <utility>

#include "cuda_ops.h"
#include "gemm.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "resources.h"

namespace lmscale::ops::cuda {

void linear_fp8(Context& ctx, const Tensor& a, const Tensor& a_inv, const Tensor& b, const Tensor& b_inv, Tensor& y,
                bool accumulate, Fp8Accumulation accumulation) {
  const std::int64_t K = a.dim(-1), M = K == 0 ? 0 : a.numel() / K, N = b.dim(0);
  LMSCALE_CHECK(y.dtype() == DType::bf16 || y.dtype() == DType::f32, "linear_fp8: y is {} (bf16 or fp32 on CUDA)",
                dtype_name(y.dtype()));
  LMSCALE_CHECK(!accumulate || y.dtype() == DType::f32, "linear_fp8: accumulating into {} (fp32 only)",
                dtype_name(y.dtype()));
  LMSCALE_CHECK(K % 16 == 0, "linear_fp8: K = {} must be a multiple of 16 (cuBLASLt FP8); a {} b {}", K,
                shape_str(a.shape()), shape_str(b.shape()));
  // Scale pointers 4 or 12 bytes into a 16-byte line made these products fail on an H100 with
  // CUBLAS_STATUS_NOT_SUPPORTED (ops/fp8_linear.h, Fp8LinearSaved); name the operand instead.
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"a_inv", &a_inv}, {"b_inv", &b_inv}})
    LMSCALE_CHECK(reinterpret_cast<std::uintptr_t>(t->data()) % 16 == 0,
                  "linear_fp8: the scale {} is not 16-byte aligned (cuBLASLt's FP8 scale pointers)", name);
  Resources& r = resources(ctx);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) LMSCALE_CUDA_CHECK(cudaMemsetAsync(y.data(), 0, y.nbytes(), r.stream));
    return;
  }
  GemmArgs g;
  g.trans_a = true;
  g.m = N, g.n = M, g.k = K;
  g.a = b.data(), g.lda = K;
  g.b = a.data(), g.ldb = K;
  g.c = y.data(), g.ldc = N;
  g.ab_type = b.dtype(), g.b_type = a.dtype(), g.c_type = y.dtype();
  g.a_scale = b_inv.data_as<const float>();
  g.b_scale = a_inv.data_as<const float>();
  g.beta = accumulate ? 1.f : 0.f;
  g.fast_accum = accumulation == Fp8Accumulation::fast;
  gemm(r, false, g);
}

}  // namespace lmscale::ops::cuda
