// ops::rmsnorm, ops::rmsnorm_backward and ops::add_rmsnorm: shape, dtype and device checks, then
// dispatch.
// x, y, dy, dx are [..., d] (N rows of d), w and dw are [d], rstd is [N] (any shape of N elements)
// in fp32, or fp64 for fp64 x.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {
namespace {

void check_norm_operands(const char* op, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  LMSCALE_CHECK(x.ndim() >= 1, "{}: x must be [..., d], got a scalar", op);
  const std::int64_t d = x.dim(-1);
  detail::check_shape(op, "w", w, {d});
  detail::check_numel(op, "rstd", rstd, detail::rows_of(op, "x", x));
  detail::check_floating(op, "x", x);
  detail::check_floating(op, "w", w);
  detail::check_dtype(op, "rstd", rstd, detail::stats_dtype(x.dtype()));
}

}  // namespace

void rmsnorm(Context& ctx, const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd, Tensor* y_amax) {
  constexpr const char* op = "ops::rmsnorm";
  const Device dev =
      detail::common_device(op, {{"x", &x}, {"w", &w}, {"y", &y}, {"rstd", &rstd}, {"y_amax", y_amax}});
  detail::check_amax_out(op, "y_amax", y_amax);
  check_norm_operands(op, x, w, rstd);
  detail::check_shape(op, "y", y, x.shape());
  detail::check_floating(op, "y", y);
  LMSCALE_CHECK(eps >= 0, "{}: eps must be >= 0, got {}", op, eps);
  if (dev == Device::cpu) return cpu::rmsnorm(ctx, x, w, eps, y, rstd, y_amax);
#ifdef LMSCALE_WITH_CUDA
  return cuda::rmsnorm(ctx, x, w, eps, y, rstd, y_amax);
#else
  detail::no_cuda_build(op);
#endif
}

void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor& dw, bool accumulate_dx, Tensor* dx_amax) {
  constexpr const char* op = "ops::rmsnorm_backward";
  const Device dev = detail::common_device(
      op, {{"x", &x}, {"w", &w}, {"rstd", &rstd}, {"dy", &dy}, {"dx", &dx}, {"dw", &dw}, {"dx_amax", dx_amax}});
  detail::check_amax_out(op, "dx_amax", dx_amax);
  check_norm_operands(op, x, w, rstd);
  detail::check_shape(op, "dy", dy, x.shape());
  detail::check_shape(op, "dx", dx, x.shape());
  detail::check_shape(op, "dw", dw, w.shape());
  detail::check_floating(op, "dy", dy);
  detail::check_floating(op, "dx", dx);
  detail::check_floating(op, "dw", dw);
  if (dev == Device::cpu) return cpu::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw, accumulate_dx, dx_amax);
#ifdef LMSCALE_WITH_CUDA
  return cuda::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw, accumulate_dx, dx_amax);
#else
  detail::no_cuda_build(op);
#endif
}

void add_rmsnorm(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& w, double eps, Tensor& sum, Tensor& y,
                 Tensor& rstd, Tensor* y_amax) {
  constexpr const char* op = "ops::add_rmsnorm";
  const Device dev = detail::common_device(
      op, {{"a", &a}, {"b", &b}, {"w", &w}, {"sum", &sum}, {"y", &y}, {"rstd", &rstd}, {"y_amax", y_amax}});
  detail::check_amax_out(op, "y_amax", y_amax);
  check_norm_operands(op, a, w, rstd);
  detail::check_shape(op, "b", b, a.shape());
  detail::check_shape(op, "sum", sum, a.shape());
  detail::check_shape(op, "y", y, a.shape());
  detail::check_same_dtype(op, "a", a, "b", b);
  detail::check_same_dtype(op, "a", a, "sum", sum);
  detail::check_floating(op, "y", y);
  LMSCALE_CHECK(eps >= 0, "{}: eps must be >= 0, got {}", op, eps);
  if (dev == Device::cpu) {   // the composition itself: the reference the CUDA kernel is held to
    cpu::add(ctx, a, b, sum);
    return cpu::rmsnorm(ctx, sum, w, eps, y, rstd, y_amax);
  }
#ifdef LMSCALE_WITH_CUDA
  return cuda::add_rmsnorm(ctx, a, b, w, eps, sum, y, rstd, y_amax);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
