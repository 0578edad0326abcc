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

// The element stride between consecutive tensors of a group when they share shape and dtype and
// lie at equal, non-overlapping distances in memory (views of one [n, ...] tensor; a block's
// weights in the flat store); 0 when they do not, or when there is only one.
std::int64_t equal_spacing(const std::vector<Tensor>& ts) {
  if (ts.size() < 2) return 0;
  const auto es = static_cast<std::ptrdiff_t>(dtype_size(ts[0].dtype()));
  const std::ptrdiff_t step = static_cast<const char*>(ts[1].data()) - static_cast<const char*>(ts[0].data());
  if (step <= 0 || step % es != 0 || step / es < ts[0].numel()) return 0;
  // A strided batch over the gap between two allocations is not one cuBLASLt handles (illegal
  // addresses on 2 H200 when lazy zero2 bucket buffers made w1/w3 gradients of different
  // allocations look evenly spaced): tensors of one group must be views of one allocation, or
  // (Tensor::view's, which name none) at most 2 tensors apart, as q, k, v and w1, w3 of a block
  // lie back to back. Within one allocation any spacing batches whose whole span stays below
  // 2 GiB: the experts' w1 and w3 matrices lie El matrices apart in the store, and their rows' a
  // and b Me rows apart (docs/moe.md, "The GPU path").
  if (static_cast<std::ptrdiff_t>(ts.size() - 1) * step >= (std::ptrdiff_t{1} << 31)) return 0;
  for (std::size_t i = 1; i < ts.size(); ++i) {
    if (ts[i].shape() != ts[0].shape() || ts[i].dtype() != ts[0].dtype()) return 0;
    if (static_cast<const char*>(ts[i].data()) - static_cast<const char*>(ts[i - 1].data()) != step) return 0;
    if (!ts[i].same_storage(ts[0]) && step / es > 2 * ts[0].numel()) return 0;
  }
  return step / es;
}
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

void linear_group(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& ys) {
  const std::int64_t sw = equal_spacing(ws), sy = equal_spacing(ys), M = rows(x), K = x.dim(-1), N = ws[0].dim(0);
  if (sw == 0 || sy == 0 || M == 0) {
    for (std::size_t i = 0; i < ws.size(); ++i) {
      Tensor y = ys[i];
      linear(ctx, x, ws[i], y);
    }
    return;
  }
  LMSCALE_CHECK(K > 0, "linear_group: K = 0");
  // y_i^T (N x M) = W_i'^T X' for every i: A steps through the weights, B (x) is shared.
  GemmArgs g;
  g.trans_a = true;
  g.m = N, g.n = M, g.k = K;
  g.a = ws[0].data(), g.lda = K;
  g.b = x.data(), g.ldb = K;
  g.c = ys[0].data(), g.ldc = N;
  g.ab_type = x.dtype(), g.c_type = ys[0].dtype();
  g.batch = static_cast<int>(ws.size());
  g.stride_a = sw, g.stride_b = 0, g.stride_c = sy;
  gemm(resources(ctx), ctx.allow_tf32, g);
}

void linear_group_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws,
                           const std::vector<Tensor>& dys, Tensor* dx, const std::vector<Tensor>* dws,
                           bool accumulate_dw) {
  const std::int64_t M = rows(x), K = x.dim(-1), N = ws[0].dim(0);
  Resources& r = resources(ctx);
  if (dx && dx->numel() > 0) {
    LMSCALE_CHECK(N > 0, "linear_group_backward: N = 0");
    // dx^T (K x M) = sum_i W_i' dY_i': the first product overwrites, the others add in the epilogue.
    for (std::size_t i = 0; i < ws.size(); ++i) {
      GemmArgs g;
      g.m = K, g.n = M, g.k = N;
      g.a = ws[i].data(), g.lda = K;
      g.b = dys[i].data(), g.ldb = N;
      g.c = dx->data(), g.ldc = K;
      g.ab_type = x.dtype(), g.c_type = dx->dtype();
      g.beta = i == 0 ? 0.f : 1.f;
      gemm(r, ctx.allow_tf32, g);
    }
  }
  if (!dws) return;
  const std::int64_t sdw = equal_spacing(*dws), sdy = equal_spacing(dys);
  if (sdw == 0 || sdy == 0 || M == 0) {
    for (std::size_t i = 0; i < ws.size(); ++i) {
      Tensor dw = (*dws)[i];
      linear_backward(ctx, x, ws[i], dys[i], nullptr, &dw, accumulate_dw);
    }
    return;
  }
  // dw_i^T (K x N) = X' dY_i'^T for every i: A (x) is shared, B and C step.
  GemmArgs g;
  g.trans_b = true;
  g.m = K, g.n = N, g.k = M;
  g.a = x.data(), g.lda = K;
  g.b = dys[0].data(), g.ldb = N;
  g.c = (*dws)[0].data(), g.ldc = K;
  g.ab_type = x.dtype(), g.c_type = (*dws)[0].dtype();
  g.beta = accumulate_dw ? 1.f : 0.f;
  g.batch = static_cast<int>(ws.size());
  g.stride_a = 0, g.stride_b = sdy, g.stride_c = sdw;
  gemm(r, ctx.allow_tf32, g);
}

void linear_columns(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, Tensor& y) {
  const std::int64_t M = rows(x), K = x.dim(-1), R = ws[0].dim(0), ld = y.dim(-1), sw = equal_spacing(ws);
  LMSCALE_CHECK(K > 0, "linear_side_by_side: K = 0");
  if (M == 0) return;
  // y_i^T (R x M, ld n*R) = W_i'^T X': one strided batch when the weights are equally spaced but
  // not back to back, C stepping R columns; else one product per weight.
  GemmArgs g;
  g.trans_a = true;
  g.m = R, g.n = M, g.k = K;
  g.b = x.data(), g.ldb = K;
  g.lda = K, g.ldc = ld;
  g.ab_type = x.dtype(), g.c_type = y.dtype();
  if (sw != 0) {
    g.a = ws[0].data(), g.c = y.data();
    g.batch = static_cast<int>(ws.size());
    g.stride_a = sw, g.stride_b = 0, g.stride_c = R;
    return gemm(resources(ctx), ctx.allow_tf32, g);
  }
  const std::size_t es = dtype_size(y.dtype());
  for (std::size_t i = 0; i < ws.size(); ++i) {
    g.a = ws[i].data();
    g.c = static_cast<char*>(y.data()) + i * static_cast<std::size_t>(R) * es;
    gemm(resources(ctx), ctx.allow_tf32, g);
  }
}

void linear_columns_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const Tensor& dy,
                             Tensor* dx, const std::vector<Tensor>* dws, bool accumulate_dw) {
  const std::int64_t M = rows(x), K = x.dim(-1), R = ws[0].dim(0), ld = dy.dim(-1);
  Resources& r = resources(ctx);
  const std::size_t es = dtype_size(dy.dtype());
  auto block = [&](std::size_t i) { return static_cast<const char*>(dy.data()) + i * static_cast<std::size_t>(R) * es; };
  if (dx && dx->numel() > 0) {
    LMSCALE_CHECK(R > 0, "linear_side_by_side_backward: R = 0");
    // dx^T (K x M) = sum_i W_i' dY_i' (dY_i' = column block i, ld n*R): the first product
    // overwrites, the others add in the epilogue.
    for (std::size_t i = 0; i < ws.size(); ++i) {
      GemmArgs g;
      g.m = K, g.n = M, g.k = R;
      g.a = ws[i].data(), g.lda = K;
      g.b = block(i), g.ldb = ld;
      g.c = dx->data(), g.ldc = K;
      g.ab_type = x.dtype(), g.c_type = dx->dtype();
      g.beta = i == 0 ? 0.f : 1.f;
      gemm(r, ctx.allow_tf32, g);
    }
  }
  if (!dws) return;
  if (M == 0) {
    for (const Tensor& dw : *dws)
      if (!accumulate_dw) LMSCALE_CUDA_CHECK(cudaMemsetAsync(dw.data(), 0, dw.nbytes(), r.stream));
    return;
  }
  // dw_i^T (K x R) = X' dY_i'^T: one strided batch (B stepping R columns) when the dws are
  // equally spaced, else one product each.
  const std::int64_t sdw = equal_spacing(*dws);
  GemmArgs g;
  g.trans_b = true;
  g.m = K, g.n = R, g.k = M;
  g.a = x.data(), g.lda = K;
  g.ldb = ld, g.ldc = K;
  g.ab_type = x.dtype(), g.c_type = (*dws)[0].dtype();
  g.beta = accumulate_dw ? 1.f : 0.f;
  if (sdw != 0) {
    g.b = block(0), g.c = (*dws)[0].data();
    g.batch = static_cast<int>(ws.size());
    g.stride_a = 0, g.stride_b = R, g.stride_c = sdw;
    return gemm(r, ctx.allow_tf32, g);
  }
  for (std::size_t i = 0; i < ws.size(); ++i) {
    g.b = block(i), g.c = (*dws)[i].data();
    gemm(r, ctx.allow_tf32, g);
  }
}

}  // namespace lmscale::ops::cuda
