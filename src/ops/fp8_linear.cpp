// Fp8Linear (lmscale/ops/fp8_linear.h): the three products of a linear layer as ops::linear_fp8
// over operands quantised once each and transposed with ops::transpose_fp8.
#include "lmscale/ops/fp8_linear.h"

#include "lmscale/core/error.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {
namespace {

Tensor as_matrix(const Tensor& t) {
  const std::int64_t cols = t.dim(-1);
  return t.reshape({cols == 0 ? 0 : t.numel() / cols, cols});
}

// q = fp8(t) under `s`, and its transpose [cols, rows].
struct Quantized {
  Tensor q, qt;
};
Quantized quantize(Context& ctx, Fp8TensorScaling& s, const Tensor& t, bool keep_direct) {
  const Tensor m = as_matrix(t);
  Tensor q = Tensor::empty(m.shape(), fp8_dtype(s.format()), *ctx.allocator, "fp8_operand");
  s.quantize(ctx, m, q);
  Tensor qt = Tensor::empty({m.dim(1), m.dim(0)}, q.dtype(), *ctx.allocator, "fp8_operand_t");
  transpose_fp8(ctx, q, qt);
  return {keep_direct ? q : Tensor(), qt};
}

Tensor copy_of(Context& ctx, const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), *ctx.allocator, "fp8_inv_scale_saved");
  copy(ctx, t, c);
  return c;
}

}  // namespace

Fp8Linear::Fp8Linear(Context& ctx, const Fp8LinearOptions& o)
    : x_(ctx, Fp8Format::e4m3, o.recipe, o.history, o.margin),
      w_(ctx, Fp8Format::e4m3, o.recipe, o.history, o.margin),
      dy_(ctx, o.grad_format, o.recipe, o.history, o.margin) {}

Fp8LinearSaved Fp8Linear::forward(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y) {
  LMSCALE_CHECK(w.ndim() == 2 && x.ndim() >= 1 && x.dim(-1) == w.dim(1),
                "Fp8Linear::forward: x {} does not match weight {} (x must be [..., {}])", shape_str(x.shape()),
                shape_str(w.shape()), w.dim(1));
  const Quantized xq = quantize(ctx, x_, x, true), wq = quantize(ctx, w_, w, true);
  Tensor y2 = as_matrix(y);
  linear_fp8(ctx, xq.q, x_.inv_scale(), wq.q, w_.inv_scale(), y2, false);
  return {xq.qt, copy_of(ctx, x_.inv_scale()), wq.qt, copy_of(ctx, w_.inv_scale())};
}

void Fp8Linear::backward(Context& ctx, const Fp8LinearSaved& saved, const Tensor& dy, Tensor* dx, Tensor* dw,
                         bool accumulate_dw) {
  if (!dx && !dw) return;
  LMSCALE_CHECK(dy.dim(-1) == saved.wt_q.dim(1), "Fp8Linear::backward: dy {} does not match the weight's {} outputs",
                shape_str(dy.shape()), saved.wt_q.dim(1));
  const Quantized dyq = quantize(ctx, dy_, dy, dx != nullptr);
  if (dx) {
    Tensor dx2 = as_matrix(*dx);
    linear_fp8(ctx, dyq.q, dy_.inv_scale(), saved.wt_q, saved.w_inv, dx2, false);   // dy . (w^T)^T
  }
  if (dw) linear_fp8(ctx, dyq.qt, dy_.inv_scale(), saved.xt_q, saved.x_inv, *dw, accumulate_dw);   // dy^T . (x^T)^T
}

}  // namespace lmscale::ops
