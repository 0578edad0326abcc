// ops::clip_grad_scale and ops::adamw_upload_scalars (ops/device_step.h): checks, then dispatch.
#include "lmscale/ops/device_step.h"

#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"

namespace lmscale::ops {

void clip_grad_scale(Context& ctx, const Tensor& partials, double inv_scale, double max_norm, Tensor& out) {
  constexpr const char* op = "ops::clip_grad_scale";
  const Device dev = detail::common_device(op, {{"partials", &partials}, {"out", &out}});
  LMSCALE_CHECK(partials.numel() >= 1, "{}: no partial sums", op);
  LMSCALE_CHECK(out.dtype() == DType::f64 && out.numel() == kClipSlots, "{}: out must be f64 [{}], is {} {}", op,
                kClipSlots, dtype_name(out.dtype()), shape_str(out.shape()));
  if (dev == Device::cpu) return cpu::clip_grad_scale(ctx, partials, inv_scale, max_norm, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::clip_grad_scale(ctx, partials, inv_scale, max_norm, out);
#else
  detail::no_cuda_build(op);
#endif
}

void adamw_upload_scalars(Context& ctx, const AdamWStep& a, Tensor& scalars) {
  constexpr const char* op = "ops::adamw_upload_scalars";
  LMSCALE_CHECK(a.step >= 1, "{}: step t is 1-based, got {}", op, a.step);
#ifdef LMSCALE_WITH_CUDA
  if (scalars.device() == Device::cuda) return cuda::adamw_upload_scalars(ctx, a, scalars);
#endif
  (void)ctx;
  throw Error(fmt::format("{}: the scalars of a captured step live on a CUDA device (train.cuda_graphs)", op));
}

}  // namespace lmscale::ops
