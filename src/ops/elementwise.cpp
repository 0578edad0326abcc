// ops:: elementwise ops and reductions (fill, add, scale, cast, copy, sum_squares, check_finite):
// shape, dtype and device checks, then dispatch. Sizes are compared by element count: these ops
// do not care about shape.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

void fill(Context& ctx, Tensor& x, double value) {
  constexpr const char* op = "ops::fill";
  const Device dev = detail::common_device(op, {{"x", &x}});
  if (dev == Device::cpu) return cpu::fill(ctx, x, value);
#ifdef LMSCALE_WITH_CUDA
  return cuda::fill(ctx, x, value);
#else
  detail::no_cuda_build(op);
#endif
}

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* op = "ops::add";
  const Device dev = detail::common_device(op, {{"a", &a}, {"b", &b}, {"out", &out}});
  detail::check_floating(op, "a", a);
  detail::check_same_dtype(op, "a", a, "b", b);
  detail::check_same_dtype(op, "a", a, "out", out);
  detail::check_numel(op, "b", b, a.numel());
  detail::check_numel(op, "out", out, a.numel());
  if (dev == Device::cpu) return cpu::add(ctx, a, b, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::add(ctx, a, b, out);
#else
  detail::no_cuda_build(op);
#endif
}

void scale(Context& ctx, Tensor& x, double s) {
  constexpr const char* op = "ops::scale";
  const Device dev = detail::common_device(op, {{"x", &x}});
  detail::check_floating(op, "x", x);
  if (dev == Device::cpu) return cpu::scale(ctx, x, s);
#ifdef LMSCALE_WITH_CUDA
  return cuda::scale(ctx, x, s);
#else
  detail::no_cuda_build(op);
#endif
}

void cast(Context& ctx, const Tensor& src, Tensor& dst) {
  constexpr const char* op = "ops::cast";
  const Device dev = detail::common_device(op, {{"src", &src}, {"dst", &dst}});
  detail::check_floating(op, "src", src);
  detail::check_floating(op, "dst", dst);
  detail::check_numel(op, "dst", dst, src.numel());
  if (dev == Device::cpu) return cpu::cast(ctx, src, dst);
#ifdef LMSCALE_WITH_CUDA
  return cuda::cast(ctx, src, dst);
#else
  detail::no_cuda_build(op);
#endif
}

void copy(Context& ctx, const Tensor& src, Tensor& dst) {
  constexpr const char* op = "ops::copy";
  LMSCALE_CHECK(src.defined() && dst.defined(), "{}: src or dst has no data", op);
  detail::check_same_dtype(op, "src", src, "dst", dst);
  detail::check_numel(op, "dst", dst, src.numel());
  if (src.device() == Device::cpu && dst.device() == Device::cpu) return cpu::copy(ctx, src, dst);
#ifdef LMSCALE_WITH_CUDA
  return cuda::copy(ctx, src, dst);
#else
  detail::no_cuda_build(op);
#endif
}

void sum_squares(Context& ctx, const Tensor& x, Tensor& out) {
  constexpr const char* op = "ops::sum_squares";
  const Device dev = detail::common_device(op, {{"x", &x}, {"out", &out}});
  detail::check_floating(op, "x", x);
  detail::check_numel(op, "out", out, 1);
  LMSCALE_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::f64, "{}: out must be fp32 or fp64, got {}", op,
                dtype_name(out.dtype()));
  if (dev == Device::cpu) return cpu::sum_squares(ctx, x, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::sum_squares(ctx, x, out);
#else
  detail::no_cuda_build(op);
#endif
}

void check_finite(Context& ctx, const Tensor& x, Tensor& flag) {
  constexpr const char* op = "ops::check_finite";
  const Device dev = detail::common_device(op, {{"x", &x}, {"flag", &flag}});
  detail::check_floating(op, "x", x);
  detail::check_dtype(op, "flag", flag, DType::i32);
  detail::check_numel(op, "flag", flag, 1);
  if (dev == Device::cpu) return cpu::check_finite(ctx, x, flag);
#ifdef LMSCALE_WITH_CUDA
  return cuda::check_finite(ctx, x, flag);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
