// ops::swiglu and ops::swiglu_backward: shape, dtype and device checks, then dispatch.
// All tensors have one shape ([N, F] in the model; any shape works, the op is elementwise); the
// _rows forms read a and b (write da, db) as [rows, cols] blocks of rows `ld` elements apart.
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
  if (dev == Device::cpu) return cpu::swiglu(ctx, a, b, 1, a.numel(), a.numel(), h, nullptr);
#ifdef LMSCALE_WITH_CUDA
  return cuda::swiglu(ctx, a, b, 1, a.numel(), a.numel(), h, nullptr);
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
  if (dev == Device::cpu) return cpu::swiglu_backward(ctx, a, b, 1, a.numel(), a.numel(), dh, da, db, nullptr);
#ifdef LMSCALE_WITH_CUDA
  return cuda::swiglu_backward(ctx, a, b, 1, a.numel(), a.numel(), dh, da, db, nullptr);
#else
  detail::no_cuda_build(op);
#endif
}

void swiglu_rows(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                 Tensor& h, Tensor* h_amax) {
  constexpr const char* op = "ops::swiglu_rows";
  const Device dev = detail::common_device(op, {{"a", &a}, {"b", &b}, {"h", &h}, {"h_amax", h_amax}});
  detail::check_amax_out(op, "h_amax", h_amax);
  detail::check_row_blocks(op, rows, cols, ld, {{"a", &a}, {"b", &b}}, {{"h", &h}});
  if (dev == Device::cpu) return cpu::swiglu(ctx, a, b, rows, cols, ld, h, h_amax);
#ifdef LMSCALE_WITH_CUDA
  return cuda::swiglu(ctx, a, b, rows, cols, ld, h, h_amax);
#else
  detail::no_cuda_build(op);
#endif
}

void swiglu_rows_backward(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                          std::int64_t ld, const Tensor& dh, Tensor& da, Tensor& db, Tensor* dab_amax) {
  constexpr const char* op = "ops::swiglu_rows_backward";
  const Device dev = detail::common_device(
      op, {{"a", &a}, {"b", &b}, {"dh", &dh}, {"da", &da}, {"db", &db}, {"dab_amax", dab_amax}});
  detail::check_amax_out(op, "dab_amax", dab_amax);
  detail::check_row_blocks(op, rows, cols, ld, {{"a", &a}, {"b", &b}, {"da", &da}, {"db", &db}}, {{"dh", &dh}});
  if (dev == Device::cpu) return cpu::swiglu_backward(ctx, a, b, rows, cols, ld, dh, da, db, dab_amax);
#ifdef LMSCALE_WITH_CUDA
  return cuda::swiglu_backward(ctx, a, b, rows, cols, ld, dh, da, db, dab_amax);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
