// Linear layer (no bias) on the CPU through OpenBLAS GEMMs, row-major, with the weight in the
// [out, in] layout of nn.Linear:
//   forward   y[M,N]  = x[M,K] . w[N,K]^T
//   backward  dx[M,K] = dy[M,N] . w[N,K],   dw[N,K] (+)= dy[M,N]^T . x[M,K]
// OpenBLAS threads follow OPENBLAS_NUM_THREADS.
#include <cblas.h>

#include <limits>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {
namespace {

blasint blas_dim(std::int64_t n) {
  LMSCALE_CHECK(n <= std::numeric_limits<blasint>::max(), "matrix dimension {} exceeds the BLAS integer range", n);
  return static_cast<blasint>(n);
}

// C[m,n] = alpha * op(A) . op(B) + beta * C, all row-major.
template <class T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {   // empty sum: C = beta * C (BLAS rejects lda = 0)
    for (std::int64_t i = 0; i < m * n; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, blas_dim(m), blas_dim(n), blas_dim(k), 1.0f, a, blas_dim(lda), b,
                blas_dim(ldb), beta, c, blas_dim(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, blas_dim(m), blas_dim(n), blas_dim(k), 1.0, a, blas_dim(lda), b,
                blas_dim(ldb), beta, c, blas_dim(ldc));
  }
}

// Rows of a [..., cols] tensor: the product of its leading dimensions.
std::int64_t leading_rows(const Tensor& t) {
  std::int64_t r = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) r *= t.dim(i);
  return r;
}

void check_real_same(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> others) {
  for (const Tensor* t : others) {
    if (!t) continue;
    LMSCALE_CHECK(t->dtype() == ref.dtype(), "{}: on CPU all tensors share one dtype; got {} and {}", op,
                  dtype_name(ref.dtype()), dtype_name(t->dtype()));
  }
}

}  // namespace

void linear(Context&, const Tensor& x, const Tensor& w, Tensor& y) {
  check_real_same("ops::linear", x, {&w, &y});
  const std::int64_t N = w.dim(0), K = w.dim(1), M = leading_rows(x);
  dispatch_real("ops::linear", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gemm<T>(CblasNoTrans, CblasTrans, M, N, K, x.data_as<T>(), K, w.data_as<T>(), K, T(0), y.data_as<T>(), N);
  });
}

void linear_backward(Context&, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                     bool accumulate_dw) {
  check_real_same("ops::linear_backward", x, {&w, &dy, dx, dw});
  const std::int64_t N = w.dim(0), K = w.dim(1), M = leading_rows(x);
  dispatch_real("ops::linear_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (dx) gemm<T>(CblasNoTrans, CblasNoTrans, M, K, N, dy.data_as<T>(), N, w.data_as<T>(), K, T(0), dx->data_as<T>(), K);
    if (dw) {
      gemm<T>(CblasTrans, CblasNoTrans, N, K, M, dy.data_as<T>(), N, x.data_as<T>(), K, accumulate_dw ? T(1) : T(0),
              dw->data_as<T>(), K);
    }
  });
}

void linear_group(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& ys) {
  for (std::size_t i = 0; i < ws.size(); ++i) {
    Tensor y = ys[i];
    linear(ctx, x, ws[i], y);
  }
}

void linear_group_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws,
                           const std::vector<Tensor>& dys, Tensor* dx, const std::vector<Tensor>* dws,
                           bool accumulate_dw) {
  const std::int64_t K = x.dim(-1), M = leading_rows(x);
  for (std::size_t i = 0; i < ws.size(); ++i) {
    check_real_same("ops::linear_group_backward", x, {&ws[i], &dys[i], dx, dws ? &(*dws)[i] : nullptr});
    const std::int64_t N = ws[i].dim(0);
    if (dx) {   // dx (+)= dy_i w_i: the first product overwrites, the others add (beta = 1)
      dispatch_real("ops::linear_group_backward", x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        gemm<T>(CblasNoTrans, CblasNoTrans, M, K, N, dys[i].data_as<T>(), N, ws[i].data_as<T>(), K, T(i == 0 ? 0 : 1),
                dx->data_as<T>(), K);
      });
    }
    if (dws) {
      Tensor dw = (*dws)[i];
      linear_backward(ctx, x, ws[i], dys[i], nullptr, &dw, accumulate_dw);
    }
  }
}

void linear_columns(Context&, const Tensor& x, const std::vector<Tensor>& ws, Tensor& y) {
  const std::int64_t K = x.dim(-1), M = leading_rows(x), R = ws[0].dim(0), ld = y.dim(-1);
  for (std::size_t i = 0; i < ws.size(); ++i) {
    check_real_same("ops::linear_side_by_side", x, {&ws[i], &y});
    dispatch_real("ops::linear_side_by_side", x.dtype(), [&](auto tag) {   // y[:, iR:(i+1)R] = x w_i^T
      using T = decltype(tag);
      gemm<T>(CblasNoTrans, CblasTrans, M, R, K, x.data_as<T>(), K, ws[i].data_as<T>(), K, T(0),
              y.data_as<T>() + static_cast<std::int64_t>(i) * R, ld);
    });
  }
}

void linear_columns_backward(Context&, const Tensor& x, const std::vector<Tensor>& ws, const Tensor& dy, Tensor* dx,
                             const std::vector<Tensor>* dws, bool accumulate_dw) {
  const std::int64_t K = x.dim(-1), M = leading_rows(x), R = ws[0].dim(0), ld = dy.dim(-1);
  for (std::size_t i = 0; i < ws.size(); ++i) {
    const Tensor* dw = dws ? &(*dws)[i] : nullptr;
    check_real_same("ops::linear_side_by_side_backward", x, {&ws[i], &dy, dx, dw});
    dispatch_real("ops::linear_side_by_side_backward", x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* dyi = dy.data_as<T>() + static_cast<std::int64_t>(i) * R;   // column block i, row stride ld
      // dx (+)= dy_i w_i: the first product overwrites, the others add (beta = 1)
      if (dx) gemm<T>(CblasNoTrans, CblasNoTrans, M, K, R, dyi, ld, ws[i].data_as<T>(), K, T(i == 0 ? 0 : 1),
                      dx->data_as<T>(), K);
      if (dw) gemm<T>(CblasTrans, CblasNoTrans, R, K, M, dyi, ld, x.data_as<T>(), K, accumulate_dw ? T(1) : T(0),
                      dw->data_as<T>(), K);
    });
  }
}

}  // namespace lmscale::ops::cpu
