// The FP8 ops (lmscale/ops/fp8.h): shape, dtype and device checks, then dispatch.
#include "lmscale/ops/fp8.h"

#include "lmscale/ops/ops.h"

#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"

namespace lmscale::ops {
namespace {

bool is_fp8(DType t) { return t == DType::e4m3 || t == DType::e5m2; }

void check_scalar(const char* op, const char* name, const Tensor& t) {
  LMSCALE_CHECK(t.dtype() == DType::f32 && t.numel() == 1, "{}: '{}' must be one fp32 element, is {} {}", op, name,
                dtype_name(t.dtype()), shape_str(t.shape()));
}

void check_fp8_dtype(const char* op, const char* name, const Tensor& t) {
  LMSCALE_CHECK(is_fp8(t.dtype()), "{}: '{}' is {}, expected fp8_e4m3 or fp8_e5m2", op, name, dtype_name(t.dtype()));
}

void check_history_update(const char* op, Device dev, const Fp8HistoryUpdate& u) {
  detail::common_device(op, {{"amax_history", &u.amax_history}, {"inv_scale", &u.inv_scale}, {"work", &u.work}});
  LMSCALE_CHECK(u.amax_history.device() == dev, "{}: the amax history is on another device than x", op);
  LMSCALE_CHECK(u.amax_history.dtype() == DType::f32 && u.amax_history.numel() >= 1,
                "{}: 'amax_history' must be fp32 with at least one element, is {} {}", op,
                dtype_name(u.amax_history.dtype()), shape_str(u.amax_history.shape()));
  LMSCALE_CHECK(u.record_slot >= -1 && u.record_slot < u.amax_history.numel(),
                "{}: record slot {} outside the history [{}]", op, u.record_slot, u.amax_history.numel());
  check_scalar(op, "inv_scale", u.inv_scale);
  LMSCALE_CHECK(u.work.dtype() == DType::i32 && u.work.numel() == 2, "{}: 'work' must be [2] int32, is {} {}", op,
                dtype_name(u.work.dtype()), shape_str(u.work.shape()));
  LMSCALE_CHECK(u.margin >= 0 && u.margin <= 64, "{}: margin {} (0 to 64)", op, u.margin);
  if (u.slot.defined())
    LMSCALE_CHECK(u.slot.dtype() == DType::i32 && u.slot.numel() == 1 && u.slot.device() == dev,
                  "{}: 'slot' must be one int32 on the data's device, is {} {}", op, dtype_name(u.slot.dtype()),
                  shape_str(u.slot.shape()));
}

}  // namespace

void amax(Context& ctx, const Tensor& x, Tensor& out) {
  constexpr const char* op = "ops::amax";
  const Device dev = detail::common_device(op, {{"x", &x}, {"out", &out}});
  detail::check_floating(op, "x", x);
  check_scalar(op, "out", out);
  if (dev == Device::cpu) return cpu::amax(ctx, x, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::amax(ctx, x, out);
#else
  detail::no_cuda_build(op);
#endif
}

void fp8_amax_update_scale(Context& ctx, const Tensor& x, Tensor& amax_history, std::int64_t slot, Fp8Format format,
                           int margin, Tensor& scale, Tensor& inv_scale, Tensor& work) {
  constexpr const char* op = "ops::fp8_amax_update_scale";
  const Device dev = detail::common_device(op, {{"x", &x}, {"scale", &scale}});
  detail::check_floating(op, "x", x);
  check_scalar(op, "scale", scale);
  check_history_update(op, dev, Fp8HistoryUpdate{amax_history, slot, format, margin, inv_scale, work});
  LMSCALE_CHECK(slot >= 0, "{}: slot {} (0 to {})", op, slot, amax_history.numel() - 1);
  if (dev == Device::cpu) return cpu::fp8_amax_update_scale(ctx, x, amax_history, slot, format, margin, scale, inv_scale);
#ifdef LMSCALE_WITH_CUDA
  return cuda::fp8_amax_update_scale(ctx, x, amax_history, slot, format, margin, scale, inv_scale, work);
#else
  detail::no_cuda_build(op);
#endif
}

void cast_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out,
              const Fp8HistoryUpdate* update) {
  constexpr const char* op = "ops::cast_fp8";
  const Device dev =
      detail::common_device(op, {{"x", &x}, {"scale", &scale}, {"out", &out}, {"amax_out", amax_out}});
  detail::check_floating(op, "x", x);
  check_scalar(op, "scale", scale);
  check_fp8_dtype(op, "out", out);
  detail::check_numel(op, "out", out, x.numel());
  if (amax_out) check_scalar(op, "amax_out", *amax_out);
  if (update) {
    LMSCALE_CHECK(!amax_out, "{}: with a history update the amax goes into the history (amax_out must be null)", op);
    check_history_update(op, dev, *update);
  }
  if (dev == Device::cpu) return cpu::cast_fp8(ctx, x, scale, out, amax_out, update);
#ifdef LMSCALE_WITH_CUDA
  return cuda::cast_fp8(ctx, x, scale, out, amax_out, update);
#else
  detail::no_cuda_build(op);
#endif
}

void cast_transpose_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor* out, Tensor* out_t,
                        const Fp8HistoryUpdate* update) {
  constexpr const char* op = "ops::cast_transpose_fp8";
  LMSCALE_CHECK(out || out_t, "{}: neither 'out' nor 'out_t' given", op);
  if (!out_t) return cast_fp8(ctx, x, scale, *out, nullptr, update);
  const Device dev = detail::common_device(op, {{"x", &x}, {"scale", &scale}, {"out", out}, {"out_t", out_t}});
  detail::check_floating(op, "x", x);
  LMSCALE_CHECK(x.ndim() == 2, "{}: 'x' must be 2-D, is {}", op, shape_str(x.shape()));
  check_scalar(op, "scale", scale);
  check_fp8_dtype(op, "out_t", *out_t);
  detail::check_shape(op, "out_t", *out_t, {x.dim(1), x.dim(0)});
  if (out) {
    detail::check_shape(op, "out", *out, x.shape());
    detail::check_same_dtype(op, "out", *out, "out_t", *out_t);
  }
  if (update) check_history_update(op, dev, *update);
  if (dev == Device::cpu) return cpu::cast_transpose_fp8(ctx, x, scale, out, *out_t, update);
#ifdef LMSCALE_WITH_CUDA
  return cuda::cast_transpose_fp8(ctx, x, scale, out, *out_t, update);
#else
  detail::no_cuda_build(op);
#endif
}

namespace {
// The outputs of a fused producer cast: out_t [C, rows] and out [rows, C] in one FP8 dtype.
void check_fused_outputs(const char* op, Device dev, std::int64_t rows, std::int64_t C, const Tensor& scale,
                         const Tensor* out, const Tensor& out_t, const Fp8HistoryUpdate* update) {
  detail::common_device(op, {{"scale", &scale}, {"out", out}, {"out_t", &out_t}});
  LMSCALE_CHECK(out_t.device() == dev, "{}: the outputs are on another device than a", op);
  check_scalar(op, "scale", scale);
  check_fp8_dtype(op, "out_t", out_t);
  detail::check_shape(op, "out_t", out_t, {C, rows});
  if (out) {
    detail::check_shape(op, "out", *out, {rows, C});
    detail::check_same_dtype(op, "out", *out, "out_t", out_t);
  }
  if (update) check_history_update(op, dev, *update);
}
}  // namespace

void swiglu_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                               std::int64_t ld, const Tensor& scale, Tensor* out, Tensor& out_t,
                               const Fp8HistoryUpdate* update) {
  constexpr const char* op = "ops::swiglu_cast_transpose_fp8";
  const Device dev = detail::common_device(op, {{"a", &a}, {"b", &b}});
  detail::check_row_blocks(op, rows, cols, ld, {{"a", &a}, {"b", &b}}, {});
  check_fused_outputs(op, dev, rows, cols, scale, out, out_t, update);
#ifdef LMSCALE_WITH_CUDA
  if (dev == Device::cuda && cuda::swiglu_cast_transpose_fp8(ctx, a, b, rows, cols, ld, scale, out, out_t, update))
    return;
#endif
  Tensor h = Tensor::empty({rows, cols}, a.dtype(), *ctx.allocator, "swiglu_output");
  swiglu_rows(ctx, a, b, rows, cols, ld, h);
  cast_transpose_fp8(ctx, h, scale, out, &out_t, update);
}

void swiglu_backward_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows,
                                        std::int64_t cols, std::int64_t ld, const Tensor& dh, const Tensor& scale,
                                        Tensor* out, Tensor& out_t, const Fp8HistoryUpdate* update) {
  constexpr const char* op = "ops::swiglu_backward_cast_transpose_fp8";
  const Device dev = detail::common_device(op, {{"a", &a}, {"b", &b}, {"dh", &dh}});
  detail::check_row_blocks(op, rows, cols, ld, {{"a", &a}, {"b", &b}}, {{"dh", &dh}});
  // da and db take a and b's row stride in swiglu_rows_backward: the plain form's da|db is [rows, 2 cols].
  LMSCALE_CHECK(ld == 2 * cols, "{}: a and b must be the column blocks of one [rows, 2 cols] a|b (ld {}, cols {})", op,
                ld, cols);
  check_fused_outputs(op, dev, rows, 2 * cols, scale, out, out_t, update);
#ifdef LMSCALE_WITH_CUDA
  if (dev == Device::cuda &&
      cuda::swiglu_backward_cast_transpose_fp8(ctx, a, b, rows, cols, ld, dh, scale, out, out_t, update))
    return;
#endif
  const Tensor dab = Tensor::empty({rows, 2 * cols}, a.dtype(), *ctx.allocator, "swiglu_grads");
  Tensor da = dab.flat_range(0, rows == 0 ? 0 : (rows - 1) * 2 * cols + cols);
  Tensor db = dab.flat_range(cols, rows == 0 ? 0 : (rows - 1) * 2 * cols + cols);
  swiglu_rows_backward(ctx, a, b, rows, cols, ld, dh, da, db);
  cast_transpose_fp8(ctx, dab, scale, out, &out_t, update);
}

void fp8_weight_casts_begin(Context& ctx, const std::vector<Fp8WeightCast>& casts, bool commit) {
  if (casts.empty()) return;
#ifdef LMSCALE_WITH_CUDA
  LMSCALE_CHECK(ctx.device == Device::cuda, "ops::fp8_weight_casts_begin: CUDA only (the CPU casts in the forward)");
  return cuda::fp8_weight_casts_begin(ctx, casts, commit);
#else
  detail::no_cuda_build("ops::fp8_weight_casts_begin");
#endif
}

void fp8_weight_casts(Context& ctx, const Tensor& param, DType rounding, const std::vector<Fp8WeightCast>& casts) {
  if (casts.empty()) return;
#ifdef LMSCALE_WITH_CUDA
  LMSCALE_CHECK(param.device() == Device::cuda, "ops::fp8_weight_casts: CUDA only (the CPU casts in the forward)");
  return cuda::fp8_weight_casts(ctx, param, rounding, casts);
#else
  detail::no_cuda_build("ops::fp8_weight_casts");
#endif
}

void transpose_fp8(Context& ctx, const Tensor& x, Tensor& out) {
  constexpr const char* op = "ops::transpose_fp8";
  const Device dev = detail::common_device(op, {{"x", &x}, {"out", &out}});
  check_fp8_dtype(op, "x", x);
  LMSCALE_CHECK(x.ndim() == 2, "{}: 'x' must be 2-D, is {}", op, shape_str(x.shape()));
  detail::check_shape(op, "out", out, {x.dim(1), x.dim(0)});
  detail::check_same_dtype(op, "x", x, "out", out);
  if (x.numel() == 0) return;
  if (dev == Device::cpu) return cpu::transpose_fp8(ctx, x, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::transpose_fp8(ctx, x, out);
#else
  detail::no_cuda_build(op);
#endif
}

void gather_scalars(Context& ctx, std::initializer_list<const Tensor*> sources, Tensor& out, std::int64_t stride) {
  constexpr const char* op = "ops::gather_scalars";
  const auto n = static_cast<std::int64_t>(sources.size());
  LMSCALE_CHECK(n >= 1 && n <= kMaxGathered, "{}: {} sources (1 to {})", op, n, kMaxGathered);
  LMSCALE_CHECK(stride >= 1, "{}: stride {} (at least 1)", op, stride);
  LMSCALE_CHECK(out.dtype() == DType::f32 && out.numel() >= (n - 1) * stride + 1,
                "{}: 'out' must be fp32 with at least {} elements, is {} {}", op, (n - 1) * stride + 1,
                dtype_name(out.dtype()), shape_str(out.shape()));
  for (const Tensor* t : sources) {
    LMSCALE_CHECK(t && t->device() == out.device(), "{}: a source is missing or on another device than 'out'", op);
    check_scalar(op, "source", *t);
  }
  if (out.device() == Device::cpu) return cpu::gather_scalars(ctx, sources, out, stride);
#ifdef LMSCALE_WITH_CUDA
  return cuda::gather_scalars(ctx, sources, out, stride);
#else
  detail::no_cuda_build(op);
#endif
}

void fp8_update_scale(Context& ctx, const Tensor& amax_history, Fp8Format format, int margin, Tensor& scale,
                      Tensor& inv_scale) {
  constexpr const char* op = "ops::fp8_update_scale";
  const Device dev =
      detail::common_device(op, {{"amax_history", &amax_history}, {"scale", &scale}, {"inv_scale", &inv_scale}});
  LMSCALE_CHECK(amax_history.dtype() == DType::f32 && amax_history.numel() >= 1,
                "{}: 'amax_history' must be fp32 with at least one element, is {} {}", op,
                dtype_name(amax_history.dtype()), shape_str(amax_history.shape()));
  check_scalar(op, "scale", scale);
  check_scalar(op, "inv_scale", inv_scale);
  LMSCALE_CHECK(margin >= 0 && margin <= 64, "{}: margin {} (0 to 64)", op, margin);
  if (dev == Device::cpu) return cpu::fp8_update_scale(ctx, amax_history, format, margin, scale, inv_scale);
#ifdef LMSCALE_WITH_CUDA
  return cuda::fp8_update_scale(ctx, amax_history, format, margin, scale, inv_scale);
#else
  detail::no_cuda_build(op);
#endif
}

void linear_fp8(Context& ctx, const Tensor& a, const Tensor& a_inv, const Tensor& b, const Tensor& b_inv, Tensor& y,
                bool accumulate, Fp8Accumulation accumulation) {
  constexpr const char* op = "ops::linear_fp8";
  const Device dev =
      detail::common_device(op, {{"a", &a}, {"a_inv", &a_inv}, {"b", &b}, {"b_inv", &b_inv}, {"y", &y}});
  check_fp8_dtype(op, "a", a);
  check_fp8_dtype(op, "b", b);
  LMSCALE_CHECK(!(a.dtype() == DType::e5m2 && b.dtype() == DType::e5m2),
                "{}: 'a' and 'b' are both fp8_e5m2 (one must be fp8_e4m3)", op);
  LMSCALE_CHECK(b.ndim() == 2, "{}: 'b' must be [N, K], got {}", op, shape_str(b.shape()));
  LMSCALE_CHECK(a.ndim() >= 1 && a.dim(-1) == b.dim(1), "{}: a {} does not match b {} (a must be [..., {}])", op,
                shape_str(a.shape()), shape_str(b.shape()), b.dim(1));
  check_scalar(op, "a_inv", a_inv);
  check_scalar(op, "b_inv", b_inv);
  Shape ys = a.shape();
  ys.back() = b.dim(0);
  detail::check_shape(op, "y", y, ys);
  detail::check_floating(op, "y", y);
  // The CPU's fp64 reference has no reduced accumulator to emulate: `accumulation` is CUDA's alone.
  if (dev == Device::cpu) return cpu::linear_fp8(ctx, a, a_inv, b, b_inv, y, accumulate);
#ifdef LMSCALE_WITH_CUDA
  return cuda::linear_fp8(ctx, a, a_inv, b, b_inv, y, accumulate, accumulation);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
