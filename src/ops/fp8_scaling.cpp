// Fp8TensorScaling (lmscale/ops/fp8_scaling.h): the two recipes over the fused ops of
// lmscale/ops/fp8.h (fp8_amax_update_scale; cast_transpose_fp8 with its Fp8HistoryUpdate).
// Amaxes, scales and (on CUDA) the history's record slot stay on the device; the host keeps its
// own slot, which the CPU records at and which on CUDA only says whether a cast records (under
// CUDA graphs it stops following the device's).
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
  work_ = Tensor::empty({2}, DType::i32, *ctx.allocator, "fp8_amax_work");
  fill(ctx, scale_, 1.0);
  fill(ctx, inv_scale_, 1.0);
  fill(ctx, history_, 0.0);
  fill(ctx, work_, 0.0);
  if (scale_.device() == Device::cuda) {
    device_slot_ = Tensor::empty({1}, DType::i32, *ctx.allocator, "fp8_amax_slot");
    fill(ctx, device_slot_, 0.0);
  }
}

int Fp8TensorScaling::next_slot(Context& ctx) const {
  if (!device_slot_.defined()) return slot_;
  Tensor h = Tensor::empty({1}, DType::i32, *ctx.host, "fp8_amax_slot");
  copy(ctx, device_slot_, h);
  return *h.data_as<const std::int32_t>();
}

std::vector<float> Fp8TensorScaling::history_oldest_first(Context& ctx) const {
  const std::int64_t H = history_.numel();
  Tensor h = Tensor::empty({H}, DType::f32, *ctx.host, "fp8_amax_history");
  copy(ctx, history_, h);
  const float* p = h.data_as<const float>();
  const int next = next_slot(ctx);
  std::vector<float> out;
  for (std::int64_t i = 0; i < H; ++i) out.push_back(p[(next + i) % H]);
  return out;
}

void Fp8TensorScaling::restore(Context& ctx, const std::vector<float>& history_oldest_first, float scale,
                               float inv_scale) {
  LMSCALE_CHECK(static_cast<std::int64_t>(history_oldest_first.size()) == history_.numel(),
                "Fp8TensorScaling::restore: a history of {} amaxes for a window of {}", history_oldest_first.size(),
                history_.numel());
  std::vector<float> h = history_oldest_first;
  copy(ctx, Tensor::view(h.data(), {history_.numel()}, DType::f32, Device::cpu), history_);
  float s = scale, inv = inv_scale;
  copy(ctx, Tensor::view(&s, {1}, DType::f32, Device::cpu), scale_);
  copy(ctx, Tensor::view(&inv, {1}, DType::f32, Device::cpu), inv_scale_);
  slot_ = 0;
  if (device_slot_.defined()) fill(ctx, device_slot_, 0.0);
  producer_armed_ = false;
  // The sources are pageable host memory: a copy to the device returns once they are staged, so
  // the locals may go.
}

void Fp8TensorScaling::quantize(Context& ctx, const Tensor& x, Tensor& out, bool record) {
  quantize(ctx, x, &out, nullptr, record);
}

Tensor Fp8TensorScaling::producer_amax() {
  LMSCALE_CHECK(recipe_ == Fp8Recipe::current,
                "Fp8TensorScaling::producer_amax: current scaling only (delayed scaling records its amax in the cast)");
  producer_armed_ = true;
  return history_;
}

void Fp8TensorScaling::quantize(Context& ctx, const Tensor& x, Tensor* out, Tensor* out_t, bool record, Fp8Amax amax) {
  for (const Tensor* o : {out, out_t})
    LMSCALE_CHECK(!o || o->dtype() == fp8_dtype(format_), "Fp8TensorScaling::quantize: out is {}, the scaling is for {}",
                  dtype_name(o->dtype()), dtype_name(fp8_dtype(format_)));
  if (amax == Fp8Amax::from_producer) {
    LMSCALE_CHECK(recipe_ == Fp8Recipe::current && producer_armed_,
                  "Fp8TensorScaling::quantize: a producer amax needs current scaling and producer_amax() handed out "
                  "before x was made");
    producer_armed_ = false;
    // The history's one entry is x's amax: the cast sets the scale from it (fp8_update_scale's
    // rule: kept when the amax is 0, inf or NaN) and records nothing.
    const Fp8HistoryUpdate update{history_, -1, format_, margin_, inv_scale_, work_};
    cast_transpose_fp8(ctx, x, scale_, out, out_t, &update);
    return;
  }
  producer_armed_ = false;
  if (recipe_ == Fp8Recipe::current) {   // the amax pass updates the scale, then the cast reads it
    fp8_amax_update_scale(ctx, x, history_, 0, format_, margin_, scale_, inv_scale_, work_);
    cast_transpose_fp8(ctx, x, scale_, out, out_t);
    return;
  }
  // Delayed: the cast sets the scale from the history, then records x's amax (one launch).
  quantize_in_producer([&](const Tensor& scale, const Fp8HistoryUpdate& update) {
    cast_transpose_fp8(ctx, x, scale, out, out_t, &update);
  }, record);
}

void Fp8TensorScaling::quantize_in_producer(const ProducerCast& cast, bool record) {
  LMSCALE_CHECK(recipe_ == Fp8Recipe::delayed,
                "Fp8TensorScaling::quantize_in_producer: delayed scaling only (current scaling needs the amax first)");
  producer_armed_ = false;
  const Fp8HistoryUpdate update{history_, record ? slot_ : -1, format_, margin_, inv_scale_, work_, device_slot_};
  cast(scale_, update);
  if (record) slot_ = static_cast<int>((slot_ + 1) % history_.numel());
}

void Fp8TensorScaling::adopt(Context& ctx, const Tensor& amax, const Tensor& scale, const Tensor& inv_scale) {
  LMSCALE_CHECK(recipe_ == Fp8Recipe::current, "Fp8TensorScaling::adopt: current scaling only (delayed keeps a window)");
  for (const Tensor* t : {&amax, &scale, &inv_scale})
    LMSCALE_CHECK(t->dtype() == DType::f32 && t->numel() == 1, "Fp8TensorScaling::adopt: {} {} is not 1 fp32 element",
                  dtype_name(t->dtype()), shape_str(t->shape()));
  copy(ctx, amax, history_);
  copy(ctx, scale, scale_);
  copy(ctx, inv_scale, inv_scale_);
}

}  // namespace lmscale::ops
