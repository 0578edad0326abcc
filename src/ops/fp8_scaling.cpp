// Fp8TensorScaling (lmscale/ops/fp8_scaling.h): the two recipes over ops::amax, ops::cast_fp8 and
// ops::fp8_update_scale. Only the slot index lives on the host; amaxes and scales stay on the device.
#include "lmscale/ops/fp8_scaling.h"

#include "lmscale/core/error.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

Fp8TensorScaling::Fp8TensorScaling(Context& ctx, Fp8Format format, Fp8Recipe recipe, int history, int margin)
    : format_(format), recipe_(recipe), margin_(margin) {
  LMSCALE_CHECK(history >= 1, "Fp8TensorScaling: amax history length {} (at least 1)", history);
  LMSCALE_CHECK(margin >= 0, "Fp8TensorScaling: margin {} (at least 0)", margin);
  const std::int64_t h = recipe == Fp8Recipe::current ? 1 : history;
  scale_ = Tensor::empty({1}, DType::f32, *ctx.allocator, "fp8_scale");
  inv_scale_ = Tensor::empty({1}, DType::f32, *ctx.allocator, "fp8_inv_scale");
  history_ = Tensor::empty({h}, DType::f32, *ctx.allocator, "fp8_amax_history");
  fill(ctx, scale_, 1.0);
  fill(ctx, inv_scale_, 1.0);
  fill(ctx, history_, 0.0);
}

void Fp8TensorScaling::quantize(Context& ctx, const Tensor& x, Tensor& out, bool record) {
  LMSCALE_CHECK(out.dtype() == fp8_dtype(format_), "Fp8TensorScaling::quantize: out is {}, the scaling is for {}",
                dtype_name(out.dtype()), dtype_name(fp8_dtype(format_)));
  Tensor slot = history_.flat_range(slot_, 1);
  if (recipe_ == Fp8Recipe::current) {
    amax(ctx, x, slot);
    fp8_update_scale(ctx, history_, format_, margin_, scale_, inv_scale_);
    cast_fp8(ctx, x, scale_, out, nullptr);
    return;
  }
  fp8_update_scale(ctx, history_, format_, margin_, scale_, inv_scale_);
  if (!record) return cast_fp8(ctx, x, scale_, out, nullptr);
  cast_fp8(ctx, x, scale_, out, &slot);
  slot_ = static_cast<int>((slot_ + 1) % history_.numel());
}

}  // namespace lmscale::ops
