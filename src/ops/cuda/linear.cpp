// linear and linear_backward on cuBLASLt (gemm.h). Row-major tensors are column-major matrices
// transposed, so each product is written for cuBLASLt on the transposes:
//   y[M,N]  = x[M,K] w[N,K]^T   ->  y^T (N x M)  = W'^T X'
//   dx[M,K] = dy[M,N] w[N,K]    ->  dx^T (K x M) = W' dY'
//   dw[N,K] = dy^T x            ->  dw^T (K x N) = X' dY'^T
// where W' (K x N, ld K), X' (K x M, ld K), dY' (N x M, ld N) are the row-major buffers read as
// column-major.
#include <fmt/format.h>

#include "cuda_ops.h"
#include "gemm.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {
std::int64_t rows(const Tensor& t) { return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }
}  // namespace

void linear(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y) {
  const std::int64_t M = rows(x), K = x.dim(-1), N = w.dim(0);
  LMSCALE_CHECK(x.dtype() == w.dtype(), "linear: x is {} but w is {}", dtype_name(x.dtype()), dtype_name(w.dtype()));
  LMSCALE_CHECK(y.dtype() == x.dtype() || y.dtype() == DType::f32, "linear: y is {} with {} inputs",
                dtype_name(y.dtype()), dtype_name(x.dtype()));
  LMSCALE_CHECK(K > 0, "linear: K = 0");
  GemmArgs g;
  g.trans_a = true;
  g.m = N, g.n = M, g.k = K;
  g.a = w.data(), g.lda = K;
  g.b = x.data(), g.ldb = K;
  g.c = y.data(), g.ldc = N;
  g.ab_type = x.dtype(), g.c_type = y.dtype();
  gemm(resources(ctx), ctx.allow_tf32, g);
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                     bool accumulate_dw) {
  const std::int64_t M = rows(x), K = x.dim(-1), N = w.dim(0);
  LMSCALE_CHECK(x.dtype() == w.dtype() && dy.dtype() == x.dtype(), "linear_backward: x {}, w {}, dy {} must match",
                dtype_name(x.dtype()), dtype_name(w.dtype()), dtype_name(dy.dtype()));
  Resources& r = resources(ctx);
  if (dx && dx->numel() > 0) {
    LMSCALE_CHECK(dx->dtype() == x.dtype() || dx->dtype() == DType::f32, "linear_backward: dx is {} with {} inputs",
                  dtype_name(dx->dtype()), dtype_name(x.dtype()));
    LMSCALE_CHECK(N > 0, "linear_backward: N = 0");
    GemmArgs g;
    g.m = K, g.n = M, g.k = N;
    g.a = w.data(), g.lda = K;
    g.b = dy.data(), g.ldb = N;
    g.c = dx->data(), g.ldc = K;
    g.ab_type = x.dtype(), g.c_type = dx->dtype();
    gemm(r, ctx.allow_tf32, g);
  }
  if (dw && dw->numel() > 0) {
    LMSCALE_CHECK(dw->dtype() == x.dtype() || dw->dtype() == DType::f32, "linear_backward: dw is {} with {} inputs",
                  dtype_name(dw->dtype()), dtype_name(x.dtype()));
    if (M == 0) {
      if (!accumulate_dw) LMSCALE_CUDA_CHECK(cudaMemsetAsync(dw->data(), 0, dw->nbytes(), r.stream));
      return;
    }
    GemmArgs g;
    g.trans_b = true;
    g.m = K, g.n = N, g.k = M;
    g.a = x.data(), g.lda = K;
    g.b = dy.data(), g.ldb = N;
    g.c = dw->data(), g.ldc = K;
    g.ab_type = x.dtype(), g.c_type = dw->dtype();
    g.beta = accumulate_dw ? 1.f : 0.f;   // accumulate in the GEMM's epilogue: no extra pass
    gemm(r, ctx.allow_tf32, g);
  }
}

}  // namespace lmscale::ops::cuda
