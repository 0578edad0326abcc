// ops::linear_cross_entropy: the fused LM head + cross-entropy (ops.h), composed of the device
// ops linear, cross_entropy and linear_backward over row chunks, so it runs wherever they do.
// Shapes: y [N,d], w [V,d], targets [N], one logits buffer [min(chunk_rows, N), V] reused by every
// chunk (the shorter last chunk uses its first rows), the gradient written over it in place.
#include <algorithm>

#include "checks.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

void linear_cross_entropy(Context& ctx, const Tensor& y, const Tensor& w, const Tensor& targets, Tensor& loss_sum,
                          Tensor* dy, Tensor* dw, bool accumulate_dw, double grad_scale, std::int64_t chunk_rows) {
  constexpr const char* op = "ops::linear_cross_entropy";
  detail::common_device(op, {{"y", &y}, {"w", &w}, {"targets", &targets}, {"loss_sum", &loss_sum}, {"dy", dy}, {"dw", dw}});
  LMSCALE_CHECK(y.ndim() == 2 && w.ndim() == 2 && y.dim(1) == w.dim(1), "{}: y {} and w {} must be [N,d] and [V,d]", op,
                shape_str(y.shape()), shape_str(w.shape()));
  detail::check_floating(op, "y", y);
  detail::check_same_dtype(op, "y", y, "w", w);
  const std::int64_t N = y.dim(0), d = y.dim(1), V = w.dim(0);
  detail::check_dtype(op, "targets", targets, DType::i32);
  detail::check_numel(op, "targets", targets, N);
  detail::check_numel(op, "loss_sum", loss_sum, 1);
  detail::check_dtype(op, "loss_sum", loss_sum, detail::stats_dtype(y.dtype()));
  LMSCALE_CHECK(chunk_rows >= 1, "{}: chunk_rows {} < 1", op, chunk_rows);
  LMSCALE_CHECK(V > 0, "{}: empty vocabulary (w {})", op, shape_str(w.shape()));
  if (dy) {
    detail::check_shape(op, "dy", *dy, y.shape());
    detail::check_same_dtype(op, "y", y, "dy", *dy);
  }
  if (dw) {
    detail::check_shape(op, "dw", *dw, w.shape());
    detail::check_floating(op, "dw", *dw);
  }
  if (N == 0) {
    fill(ctx, loss_sum, 0.0);
    if (dw && !accumulate_dw) fill(ctx, *dw, 0.0);
    return;
  }
  const bool grad = dy || dw;
  const std::int64_t rows = std::min(chunk_rows, N);
  Tensor logits = Tensor::empty({rows, V}, y.dtype(), *ctx.allocator, "logits");
  // Each chunk's loss goes to `part` and is added to the total (the first straight into it).
  Tensor part = rows < N ? Tensor::empty({1}, loss_sum.dtype(), *ctx.allocator, "loss") : Tensor();
  for (std::int64_t r0 = 0; r0 < N; r0 += rows) {
    const std::int64_t n = std::min(rows, N - r0);
    const bool whole = n == N;
    const Tensor yc = whole ? y : y.flat_range(r0 * d, n * d).reshape({n, d});
    const Tensor tc = whole ? targets : targets.reshape({N}).flat_range(r0, n);
    Tensor z = n == rows ? logits : logits.flat_range(0, n * V).reshape({n, V});
    linear(ctx, yc, w, z);
    Tensor& loss = r0 == 0 ? loss_sum : part;
    cross_entropy(ctx, z, tc, loss, grad ? &z : nullptr, grad_scale);
    if (r0 > 0) add(ctx, loss_sum, part, loss_sum);
    if (!grad) continue;
    Tensor dyc;
    if (dy) dyc = whole ? *dy : dy->flat_range(r0 * d, n * d).reshape({n, d});
    linear_backward(ctx, yc, w, z, dy ? &dyc : nullptr, dw, accumulate_dw || r0 > 0);
  }
}

}  // namespace lmscale::ops
