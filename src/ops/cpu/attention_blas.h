#pragma once
// Row-major cblas GEMM for float and double, used by the CPU attention kernels:
// C[M,N] = alpha * op(A) op(B) + beta * C with leading dimensions in elements.
#include <cblas.h>

#include <cstdint>

#include "lmscale/ops/ops.h"

namespace lmscale::ops::cpu::attention_detail {

inline void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
              beta, C, static_cast<int>(ldc));
}
inline void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A,
                 std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
              beta, C, static_cast<int>(ldc));
}

// Offset of head (b, h) in the strided layout of q, k, v (dq, dk, dv).
inline std::int64_t head_offset(const ops::AttentionShape& s, std::int64_t b, std::int64_t h) {
  return b * s.stride_b + h * s.stride_h;
}
// The same in the layout of o and dO.
inline std::int64_t o_head_offset(const ops::AttentionShape& s, std::int64_t b, std::int64_t h) {
  return b * s.o_stride_b + h * s.o_stride_h;
}

}  // namespace lmscale::ops::cpu::attention_detail
