// ops::linear and ops::linear_backward: shape, dtype and device checks, products counted
// (Context::linear_products), then dispatch.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"
#include "product_counts.h"

namespace lmscale::ops {
namespace {

// The shape of y for x [..., K] and w [N, K]: [..., N].
Shape output_shape(const Tensor& x, std::int64_t N) {
  Shape s = x.shape();
  s.back() = N;
  return s;
}

void check_operands(const char* op, const Tensor& x, const Tensor& w) {
  LMSCALE_CHECK(w.ndim() == 2, "{}: weight must be [out, in], got {}", op, shape_str(w.shape()));
  LMSCALE_CHECK(x.ndim() >= 1 && x.dim(-1) == w.dim(1), "{}: x {} does not match weight {} (x must be [..., {}])", op,
                shape_str(x.shape()), shape_str(w.shape()), w.dim(1));
  detail::check_floating(op, "x", x);
  detail::check_same_dtype(op, "x", x, "w", w);
}

}  // namespace

void linear(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y) {
  constexpr const char* op = "ops::linear";
  const Device dev = detail::common_device(op, {{"x", &x}, {"w", &w}, {"y", &y}});
  check_operands(op, x, w);
  detail::check_shape(op, "y", y, output_shape(x, w.dim(0)));
  detail::check_same_dtype(op, "x", x, "y", y);
  detail::count_products(ctx, 1, 0, 0);
  if (dev == Device::cpu) return cpu::linear(ctx, x, w, y);
#ifdef LMSCALE_WITH_CUDA
  return cuda::linear(ctx, x, w, y);
#else
  detail::no_cuda_build(op);
#endif
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                     bool accumulate_dw) {
  constexpr const char* op = "ops::linear_backward";
  const Device dev = detail::common_device(op, {{"x", &x}, {"w", &w}, {"dy", &dy}, {"dx", dx}, {"dw", dw}});
  check_operands(op, x, w);
  detail::check_shape(op, "dy", dy, output_shape(x, w.dim(0)));
  detail::check_same_dtype(op, "x", x, "dy", dy);
  if (dx) {
    detail::check_shape(op, "dx", *dx, x.shape());
    detail::check_same_dtype(op, "x", x, "dx", *dx);
  }
  if (dw) {
    detail::check_shape(op, "dw", *dw, w.shape());
    detail::check_floating(op, "dw", *dw);
  }
  if (!dx && !dw) return;
  detail::count_products(ctx, 0, dx ? 1 : 0, dw ? 1 : 0);
  if (dev == Device::cpu) return cpu::linear_backward(ctx, x, w, dy, dx, dw, accumulate_dw);
#ifdef LMSCALE_WITH_CUDA
  return cuda::linear_backward(ctx, x, w, dy, dx, dw, accumulate_dw);
#else
  detail::no_cuda_build(op);
#endif
}

void linear_group(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& ys) {
  constexpr const char* op = "ops::linear_group";
  LMSCALE_CHECK(!ws.empty() && ws.size() == ys.size(), "{}: {} weights and {} outputs", op, ws.size(), ys.size());
  for (std::size_t i = 0; i < ws.size(); ++i) {
    detail::common_device(op, {{"x", &x}, {"w", &ws[i]}, {"y", &ys[i]}});
    check_operands(op, x, ws[i]);
    detail::check_shape(op, "w", ws[i], ws[0].shape());
    detail::check_shape(op, "y", ys[i], output_shape(x, ws[i].dim(0)));
    detail::check_same_dtype(op, "x", x, "y", ys[i]);
  }
  detail::count_products(ctx, static_cast<std::int64_t>(ws.size()), 0, 0);
  if (x.device() == Device::cpu) return cpu::linear_group(ctx, x, ws, ys);
#ifdef LMSCALE_WITH_CUDA
  return cuda::linear_group(ctx, x, ws, ys);
#else
  detail::no_cuda_build(op);
#endif
}

void linear_group_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws,
                           const std::vector<Tensor>& dys, Tensor* dx, const std::vector<Tensor>* dws,
                           bool accumulate_dw) {
  constexpr const char* op = "ops::linear_group_backward";
  LMSCALE_CHECK(!ws.empty() && ws.size() == dys.size() && (!dws || dws->size() == ws.size()),
                "{}: {} weights, {} output gradients, {} weight gradients", op, ws.size(), dys.size(),
                dws ? dws->size() : 0);
  for (std::size_t i = 0; i < ws.size(); ++i) {
    const Tensor* dw = dws ? &(*dws)[i] : nullptr;
    detail::common_device(op, {{"x", &x}, {"w", &ws[i]}, {"dy", &dys[i]}, {"dx", dx}, {"dw", dw}});
    check_operands(op, x, ws[i]);
    detail::check_shape(op, "w", ws[i], ws[0].shape());
    detail::check_shape(op, "dy", dys[i], output_shape(x, ws[i].dim(0)));
    detail::check_same_dtype(op, "x", x, "dy", dys[i]);
    if (dw) {
      detail::check_shape(op, "dw", *dw, ws[i].shape());
      detail::check_floating(op, "dw", *dw);
    }
  }
  if (dx) {
    detail::check_shape(op, "dx", *dx, x.shape());
    detail::check_same_dtype(op, "x", x, "dx", *dx);
  }
  if (!dx && !dws) return;
  const auto n = static_cast<std::int64_t>(ws.size());
  detail::count_products(ctx, 0, dx ? n : 0, dws ? n : 0);
  if (x.device() == Device::cpu) return cpu::linear_group_backward(ctx, x, ws, dys, dx, dws, accumulate_dw);
#ifdef LMSCALE_WITH_CUDA
  return cuda::linear_group_backward(ctx, x, ws, dys, dx, dws, accumulate_dw);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
