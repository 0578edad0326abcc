// Fp8Linear (lmscale/ops/fp8_linear.h): the three products of a linear layer as ops::linear_fp8
// over operands quantised once each, cast and transposed in one pass (ops::cast_transpose_fp8).
// Every product of the forward (forward, replay) takes the options' forward_accumulation, dx and
// dW their grad_accumulation, so a recompute's y is bitwise the first forward's.
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

// q = fp8(t) under `s` (only when keep_direct: a GEMM reads it), and its transpose [cols, rows],
// from one pass over t (ops::cast_transpose_fp8).
struct Quantized {
  Tensor q, qt;
};
// The cast: under the operand's scaling (scaling set), or with a given scale (a replay).
Quantized quantize(Context& ctx, Fp8TensorScaling* s, const Tensor* scale, Fp8Format format, const Tensor& t,
                   bool keep_direct, bool record = true, Fp8Amax amax = Fp8Amax::measure) {
  const Tensor m = as_matrix(t);
  Tensor q = keep_direct ? Tensor::empty(m.shape(), fp8_dtype(format), *ctx.allocator, "fp8_operand") : Tensor();
  Tensor qt = Tensor::empty({m.dim(1), m.dim(0)}, fp8_dtype(format), *ctx.allocator, "fp8_operand_t");
  Tensor* direct = keep_direct ? &q : nullptr;
  if (s) s->quantize(ctx, m, direct, &qt, record, amax);
  else cast_transpose_fp8(ctx, m, *scale, direct, &qt);
  return {q, qt};
}

void check_x_w(const Fp8Input& x, const Tensor& w) {
  LMSCALE_CHECK(w.ndim() == 2 && x.qt.defined() && x.qt.dim(0) == w.dim(1),
                "Fp8Linear::forward: x [{}, {}] does not match weight {} (x must be [..., {}])",
                x.qt.defined() ? x.qt.dim(1) : 0, x.qt.defined() ? x.qt.dim(0) : 0, shape_str(w.shape()), w.dim(1));
}

void check_scales(const Tensor& scales) {
  LMSCALE_CHECK(scales.dtype() == DType::f32 && scales.numel() == 4 * Fp8LinearSaved::kScaleStride,
                "Fp8Linear::replay: scales must be the [16] fp32 of a forward's saved entry, got {} {}",
                dtype_name(scales.dtype()), shape_str(scales.shape()));
}

}  // namespace

Fp8Linear::Fp8Linear(Context& ctx, const Fp8LinearOptions& o)
    : x_(ctx, Fp8Format::e4m3, o.recipe, o.history, o.margin),
      w_(ctx, Fp8Format::e4m3, o.recipe, o.history, o.margin),
      dy_(ctx, o.grad_format, o.recipe, o.history, o.margin),
      forward_accumulation_(o.forward_accumulation),
      grad_accumulation_(o.grad_accumulation) {}

Fp8Input Fp8Linear::quantize_input(Context& ctx, const Tensor& x, bool record, Fp8Amax amax) {
  const Quantized xq = quantize(ctx, &x_, nullptr, x_.format(), x, true, record, amax);
  return {xq.q, xq.qt, x_.scale(), x_.inv_scale()};
}

Fp8Input Fp8Linear::replay_input(Context& ctx, const Tensor& scales, const Tensor& x, bool direct) const {
  check_scales(scales);
  const Tensor xs = scales.flat_range(0 * Fp8LinearSaved::kScaleStride, 1);
  const Quantized xq = quantize(ctx, nullptr, &xs, Fp8Format::e4m3, x, direct);
  return {xq.q, xq.qt, xs, scales.flat_range(1 * Fp8LinearSaved::kScaleStride, 1)};
}

Fp8LinearSaved Fp8Linear::forward(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y, bool record) {
  LMSCALE_CHECK(w.ndim() == 2 && x.ndim() >= 1 && x.dim(-1) == w.dim(1),
                "Fp8Linear::forward: x {} does not match weight {} (x must be [..., {}])", shape_str(x.shape()),
                shape_str(w.shape()), w.dim(1));
  return forward(ctx, quantize_input(ctx, x, record), w, y, record);
}

Fp8LinearSaved Fp8Linear::forward(Context& ctx, const Fp8Input& x, const Tensor& w, Tensor& y, bool record) {
  check_x_w(x, w);
  LMSCALE_CHECK(x.q.defined(), "Fp8Linear::forward: the quantised input has no direct operand for the GEMM");
  const Quantized wq = quantize(ctx, &w_, nullptr, w_.format(), w, true, record);
  Tensor y2 = as_matrix(y);
  linear_fp8(ctx, x.q, x.inv, wq.q, w_.inv_scale(), y2, false, forward_accumulation_);
  Fp8LinearSaved saved{x.qt, wq.qt,
                       Tensor::empty({4 * Fp8LinearSaved::kScaleStride}, DType::f32, *ctx.allocator, "fp8_scales_saved")};
  // One launch for the four values; the 12 bytes after each are padding, never read (no fill).
  gather_scalars(ctx, {&x.scale, &x.inv, &w_.scale(), &w_.inv_scale()}, saved.scales, Fp8LinearSaved::kScaleStride);
  return saved;
}

namespace {
void check_fp8_weight(const Fp8Input& x, const Fp8Weight& w) {
  LMSCALE_CHECK(w.q.ndim() == 2 && w.q.dtype() == DType::e4m3,
                "Fp8Linear: a quantised weight must be 2-D fp8_e4m3, got {} {}", dtype_name(w.q.dtype()),
                shape_str(w.q.shape()));
  LMSCALE_CHECK(!w.qt.defined() || (w.qt.dtype() == DType::e4m3 && w.qt.ndim() == 2 && w.qt.dim(0) == w.q.dim(1) &&
                                    w.qt.dim(1) == w.q.dim(0)),
                "Fp8Linear: a quantised weight's transpose {} does not match {}", shape_str(w.qt.shape()),
                shape_str(w.q.shape()));
  check_x_w(x, w.q);
}
// wt_q [K,N]: the backward's operand, the byte transpose of the quantised weight (exact).
Tensor transposed(Context& ctx, const Tensor& q) {
  Tensor t = Tensor::empty({q.dim(1), q.dim(0)}, q.dtype(), *ctx.allocator, "fp8_operand_t");
  transpose_fp8(ctx, q, t);
  return t;
}
}  // namespace

Fp8LinearSaved Fp8Linear::forward(Context& ctx, const Fp8Input& x, const Fp8Weight& w, Tensor& y) {
  check_fp8_weight(x, w);
  LMSCALE_CHECK(x.q.defined(), "Fp8Linear::forward: the quantised input has no direct operand for the GEMM");
  // Cast under this layer's own scaling (model/fp8_weight_casts.h): its state is already the cast's.
  const bool own = w.scale.data() == w_.scale().data() && w.inv.data() == w_.inv_scale().data();
  LMSCALE_CHECK(own || w_.recipe() == Fp8Recipe::current,
                "Fp8Linear::forward: a weight quantised elsewhere needs current scaling (its scale is the weight's "
                "amax now)");
  if (!own) w_.adopt(ctx, w.amax, w.scale, w.inv);
  Tensor y2 = as_matrix(y);
  linear_fp8(ctx, x.q, x.inv, w.q, w_.inv_scale(), y2, false, forward_accumulation_);
  Fp8LinearSaved saved{x.qt, w.qt.defined() ? w.qt : transposed(ctx, w.q),
                       Tensor::empty({4 * Fp8LinearSaved::kScaleStride}, DType::f32, *ctx.allocator, "fp8_scales_saved")};
  gather_scalars(ctx, {&x.scale, &x.inv, &w_.scale(), &w_.inv_scale()}, saved.scales, Fp8LinearSaved::kScaleStride);
  return saved;
}

Fp8LinearSaved Fp8Linear::replay(Context& ctx, const Tensor& scales, const Fp8Input& x, const Fp8Weight& w, Tensor* y) {
  check_fp8_weight(x, w);
  check_scales(scales);
  Fp8LinearSaved saved{x.qt, Tensor(), scales};
  if (y) {
    LMSCALE_CHECK(x.q.defined(), "Fp8Linear::replay: the quantised input has no direct operand for the GEMM");
    Tensor y2 = as_matrix(*y);
    linear_fp8(ctx, x.q, saved.x_inv(), w.q, saved.w_inv(), y2, false, forward_accumulation_);
  }
  saved.wt_q = w.qt.defined() ? w.qt : transposed(ctx, w.q);
  return saved;
}

Fp8LinearSaved Fp8Linear::replay(Context& ctx, const Tensor& scales, const Tensor& x, const Tensor& w, Tensor* y) {
  LMSCALE_CHECK(w.ndim() == 2 && x.ndim() >= 1 && x.dim(-1) == w.dim(1),
                "Fp8Linear::replay: x {} does not match weight {} (x must be [..., {}])", shape_str(x.shape()),
                shape_str(w.shape()), w.dim(1));
  return replay(ctx, scales, replay_input(ctx, scales, x, y != nullptr), w, y);
}

Fp8LinearSaved Fp8Linear::replay(Context& ctx, const Tensor& scales, const Fp8Input& x, const Tensor& w, Tensor* y) {
  check_x_w(x, w);
  check_scales(scales);
  Fp8LinearSaved saved{x.qt, Tensor(), scales};
  const Tensor ws = saved.w_scale();
  const Quantized wq = quantize(ctx, nullptr, &ws, w_.format(), w, y != nullptr);
  if (y) {
    LMSCALE_CHECK(x.q.defined(), "Fp8Linear::replay: the quantised input has no direct operand for the GEMM");
    Tensor y2 = as_matrix(*y);
    linear_fp8(ctx, x.q, saved.x_inv(), wq.q, saved.w_inv(), y2, false, forward_accumulation_);
  }
  saved.wt_q = wq.qt;
  return saved;
}

void Fp8Linear::backward(Context& ctx, const Fp8LinearSaved& saved, const Tensor& dy, Tensor* dx, Tensor* dw,
                         bool accumulate_dw, Fp8Amax dy_amax) {
  backward(ctx, saved, dy, dx, dw ? std::vector<Tensor>{*dw} : std::vector<Tensor>{}, accumulate_dw, dy_amax);
}

Fp8Input Fp8Linear::quantize_grad(Context& ctx, const Tensor& dy, bool direct, Fp8Amax dy_amax) {
  const Quantized q = quantize(ctx, &dy_, nullptr, dy_.format(), dy, direct, true, dy_amax);
  return {q.q, q.qt, dy_.scale(), dy_.inv_scale()};
}

namespace {
// q [rows, cols] (when direct) and qt [cols, rows] in `format`, written by `cast` through `s`.
Quantized producer_cast(Context& ctx, Fp8TensorScaling& s, std::int64_t rows, std::int64_t cols, bool direct,
                        bool record, const Fp8Linear::ProducerCast& cast) {
  const DType t = fp8_dtype(s.format());
  Tensor q = direct ? Tensor::empty({rows, cols}, t, *ctx.allocator, "fp8_operand") : Tensor();
  Tensor qt = Tensor::empty({cols, rows}, t, *ctx.allocator, "fp8_operand_t");
  s.quantize_in_producer([&](const Tensor& scale, const Fp8HistoryUpdate& update) {
    cast(scale, update, direct ? &q : nullptr, qt);
  }, record);
  return {q, qt};
}
}  // namespace

Fp8Input Fp8Linear::quantize_input(Context& ctx, std::int64_t rows, std::int64_t cols, const ProducerCast& cast,
                                   bool record) {
  const Quantized q = producer_cast(ctx, x_, rows, cols, true, record, cast);
  return {q.q, q.qt, x_.scale(), x_.inv_scale()};
}

Fp8Input Fp8Linear::quantize_grad(Context& ctx, std::int64_t rows, std::int64_t cols, const ProducerCast& cast,
                                  bool direct) {
  const Quantized q = producer_cast(ctx, dy_, rows, cols, direct, true, cast);
  return {q.q, q.qt, dy_.scale(), dy_.inv_scale()};
}

void Fp8Linear::backward(Context& ctx, const Fp8LinearSaved& saved, const Tensor& dy, Tensor* dx,
                         const std::vector<Tensor>& dws, bool accumulate_dw, Fp8Amax dy_amax) {
  if (!dx && dws.empty()) return;
  LMSCALE_CHECK(dy.dim(-1) == saved.wt_q.dim(1), "Fp8Linear::backward: dy {} does not match the weight's {} outputs",
                shape_str(dy.shape()), saved.wt_q.dim(1));
  backward(ctx, saved, quantize_grad(ctx, dy, dx != nullptr, dy_amax), dx, dws, accumulate_dw);
}

void Fp8Linear::backward(Context& ctx, const Fp8LinearSaved& saved, const Fp8Input& dyq, Tensor* dx,
                         const std::vector<Tensor>& dws, bool accumulate_dw) {
  LMSCALE_CHECK(dyq.qt.defined() && dyq.qt.dim(0) == saved.wt_q.dim(1),
                "Fp8Linear::backward: the quantised dy has {} outputs, the weight {}",
                dyq.qt.defined() ? dyq.qt.dim(0) : 0, saved.wt_q.dim(1));
  if (dx) {
    LMSCALE_CHECK(dyq.q.defined(), "Fp8Linear::backward: dx needs the quantised dy's direct operand");
    Tensor dx2 = as_matrix(*dx);
    // dy . (w^T)^T
    linear_fp8(ctx, dyq.q, dyq.inv, saved.wt_q, saved.w_inv(), dx2, false, grad_accumulation_);
  }
  std::int64_t row = 0;   // dy^T's rows [row, row + N_i) are dW_i's outputs
  for (const Tensor& dw : dws) {
    LMSCALE_CHECK(dw.ndim() == 2 && row + dw.dim(0) <= dyq.qt.dim(0),
                  "Fp8Linear::backward: weight gradient {} beyond the layer's {} outputs (row {})", shape_str(dw.shape()),
                  dyq.qt.dim(0), row);
    Tensor out = dw;
    const Tensor rows = dws.size() == 1 ? dyq.qt : dyq.qt.slice(row, row + dw.dim(0));
    linear_fp8(ctx, rows, dyq.inv, saved.xt_q, saved.x_inv(), out, accumulate_dw,
               grad_accumulation_);   // dy^T . (x^T)^T
    row += dw.dim(0);
  }
  LMSCALE_CHECK(dws.empty() || row == dyq.qt.dim(0),
                "Fp8Linear::backward: the weight gradients cover {} of the layer's {} outputs", row, dyq.qt.dim(0));
}

}  // namespace lmscale::ops
