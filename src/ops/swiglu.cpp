// ops::swiglu and ops::swiglu_backward: shape, dtype and device checks, then dispatch.
// All tensors have one shape ([N, F] in the model; any shape works, the op is elementwise).
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

void swiglu(Context& ctx, const Tensor& a, const Tensor& b, Tensor& h) {
  constexpr const char* op = "ops::swiglu";
  const Device dev = detail::common_device(op, {{"a", &a}, {"b", &b}, {"h", &h}});
  detail::check_shape(op, "b", b, a.shape());
  detail::check_shape(op, "h", h, a.shape());
  detail::check_floating(op, "a", a);
  detail::check_same_dtype(op, "a", a, "b", b);
  detail::check_same_dtype(op, "a", a, "h", h);
  if (dev == Device::cpu) return cpu::swiglu(ctx, a, b, h);
#ifdef LMSCALE_WITH_CUDA
  return cuda::swiglu(ctx, a, b, h);
#else
  detail::no_cuda_build(op);
#endif
}

void swiglu_backward(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& dh, Tensor& da, Tensor& db) {
  constexpr const char* op = "ops::swiglu_backward";
  const Device dev = detail::common_device(op, {{"a", &a}, {"b", &b}, {"dh", &dh}, {"da", &da}, {"db", &db}});
  for (const auto& [name, t] : {detail::NamedTensor{"b", &b}, {"dh", &dh}, {"da", &da}, {"db", &db}}) {
    detail::check_shape(op, name, *t, a.shape());
    detail::check_same_dtype(op, "a", a, name, *t);
  }
  detail::check_floating(op, "a", a);
  if (dev == Device::cpu) return cpu::swiglu_backward(ctx, a, b, dh, da, db);
#ifdef LMSCALE_WITH_CUDA
  return cuda::swiglu_backward(ctx, a, b, dh, da, db);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
