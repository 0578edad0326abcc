// ops::linear_side_by_side and its backward: checks, then either one plain linear product over the
// group's weights viewed as one [n*R, K] matrix (when they lie back to back in memory) or the
// backend's per-weight products on column blocks (cpu::/cuda::linear_columns*).
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"
#include "product_counts.h"

namespace lmscale::ops {
namespace {

// The group as one [n*R, K] matrix when ts[i+1] starts right where ts[i] ends (same shape and
// dtype): the parameter store's q, k, v (and their gradients in one flat buffer). Undefined when not.
Tensor back_to_back(const std::vector<Tensor>& ts) {
  const std::size_t es = dtype_size(ts[0].dtype());
  for (std::size_t i = 1; i < ts.size(); ++i) {
    if (ts[i].shape() != ts[0].shape() || ts[i].dtype() != ts[0].dtype()) return Tensor();
    if (static_cast<const char*>(ts[i].data()) != static_cast<const char*>(ts[i - 1].data()) + ts[0].numel() * es)
      return Tensor();
  }
  const auto n = static_cast<std::int64_t>(ts.size());
  return Tensor::view(ts[0].data(), {n * ts[0].dim(0), ts[0].dim(1)}, ts[0].dtype(), ts[0].device());
}

// Checks every weight against x and returns y's / dy's shape [M, n*R].
Shape side_by_side_shape(const char* op, const Tensor& x, const std::vector<Tensor>& ws) {
  LMSCALE_CHECK(!ws.empty(), "{}: no weights", op);
  detail::check_floating(op, "x", x);
  LMSCALE_CHECK(x.ndim() == 2, "{}: x must be [M, K], got {}", op, shape_str(x.shape()));
  for (const Tensor& w : ws) {
    detail::common_device(op, {{"x", &x}, {"w", &w}});
    LMSCALE_CHECK(w.ndim() == 2 && w.dim(1) == x.dim(1), "{}: weight {} does not match x {} (weights are [R, {}])",
                  op, shape_str(w.shape()), shape_str(x.shape()), x.dim(1));
    detail::check_shape(op, "w", w, ws[0].shape());
    detail::check_same_dtype(op, "x", x, "w", w);
  }
  return {x.dim(0), static_cast<std::int64_t>(ws.size()) * ws[0].dim(0)};
}

}  // namespace

void linear_side_by_side(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, Tensor& y) {
  constexpr const char* op = "ops::linear_side_by_side";
  detail::check_shape(op, "y", y, side_by_side_shape(op, x, ws));
  detail::common_device(op, {{"x", &x}, {"y", &y}});
  detail::check_same_dtype(op, "x", x, "y", y);
  const Tensor w = back_to_back(ws);
  if (w.defined()) return linear(ctx, x, w, y);   // one GEMM: y = x [w0; w1; ...]^T (counted there)
  detail::count_products(ctx, static_cast<std::int64_t>(ws.size()), 0, 0);
  if (x.device() == Device::cpu) return cpu::linear_columns(ctx, x, ws, y);
#ifdef LMSCALE_WITH_CUDA
  return cuda::linear_columns(ctx, x, ws, y);
#else
  detail::no_cuda_build(op);
#endif
}

void linear_side_by_side_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const Tensor& dy,
                                  Tensor* dx, const std::vector<Tensor>* dws, bool accumulate_dw) {
  constexpr const char* op = "ops::linear_side_by_side_backward";
  detail::check_shape(op, "dy", dy, side_by_side_shape(op, x, ws));
  detail::common_device(op, {{"x", &x}, {"dy", &dy}, {"dx", dx}});
  detail::check_same_dtype(op, "x", x, "dy", dy);
  if (dx) {
    detail::check_shape(op, "dx", *dx, x.shape());
    detail::check_same_dtype(op, "x", x, "dx", *dx);
  }
  if (dws) {
    LMSCALE_CHECK(dws->size() == ws.size(), "{}: {} weights but {} weight gradients", op, ws.size(), dws->size());
    for (const Tensor& dw : *dws) {
      detail::common_device(op, {{"x", &x}, {"dw", &dw}});
      detail::check_shape(op, "dw", dw, ws[0].shape());
      detail::check_floating(op, "dw", dw);
      detail::check_same_dtype(op, "dw", dw, "dw", (*dws)[0]);
    }
  }
  const Tensor w = back_to_back(ws);
  Tensor dw = dws ? back_to_back(*dws) : Tensor();
  const bool cpu = x.device() == Device::cpu;
  auto columns = [&](Tensor* dx_part, const std::vector<Tensor>* dws_part) {
    const auto n = static_cast<std::int64_t>(ws.size());
    detail::count_products(ctx, 0, dx_part ? n : 0, dws_part ? n : 0);
    if (cpu) return cpu::linear_columns_backward(ctx, x, ws, dy, dx_part, dws_part, accumulate_dw);
#ifdef LMSCALE_WITH_CUDA
    return cuda::linear_columns_backward(ctx, x, ws, dy, dx_part, dws_part, accumulate_dw);
#else
    detail::no_cuda_build(op);
#endif
  };
  if (dx) {   // dx = dy [w0; w1; ...]: one GEMM, inner dimension n*R
    if (w.defined()) linear_backward(ctx, x, w, dy, dx, nullptr, accumulate_dw);
    else columns(dx, nullptr);
  }
  if (dws) {   // [dw0; dw1; ...] (+)= dy^T x: one GEMM when both groups lie back to back
    // Every gradient layout keeps a group's gradients back to back (gradient buckets never split
    // one: parallel/grad_buckets.h), so a run's bits do not depend on its layout; OpenBLAS would
    // round a row block of a larger product differently from the block's own product.
    if (w.defined() && dw.defined()) linear_backward(ctx, x, w, dy, nullptr, &dw, accumulate_dw);
    else columns(nullptr, dws);
  }
}

}  // namespace lmscale::ops
