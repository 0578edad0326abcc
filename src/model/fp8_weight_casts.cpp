// Fp8WeightCasts (lmscale/model/fp8_weight_casts.h): the host's two flags around the ops.
#include "lmscale/model/fp8_weight_casts.h"

#include "lmscale/core/error.h"

namespace lmscale::model {

Fp8WeightCasts::Fp8WeightCasts(std::vector<ops::Fp8WeightCast> casts, Tensor params, DType rounding)
    : casts_(std::move(casts)), params_(std::move(params)), rounding_(rounding) {}

void Fp8WeightCasts::cast_now(Context& ctx) {
  // A pending amax (a skipped step's) is that of the weights the last forward read, which that
  // forward's own cast would have recorded: recorded first, then the unchanged weights cast again.
  ops::fp8_weight_casts_begin(ctx, casts_, pending_);
  ops::fp8_weight_casts(ctx, params_, rounding_, casts_);
  ready_ = pending_ = true;
}

ops::Fp8Weight Fp8WeightCasts::weight(std::size_t i) const {
  LMSCALE_CHECK(i < casts_.size(), "Fp8WeightCasts: cast {} of {}", i, casts_.size());
  const ops::Fp8WeightCast& c = casts_[i];
  ops::Fp8Weight w;
  w.q = c.q;
  w.qt = c.qt;
  w.amax = c.pending_amax;
  w.scale = c.scale;
  w.inv = c.history.inv_scale;
  return w;
}

std::size_t Fp8WeightCasts::bytes() const {
  std::size_t b = 0;
  for (const ops::Fp8WeightCast& c : casts_) b += c.q.nbytes() + c.qt.nbytes() + c.pending_amax.nbytes();
  return b;
}

}  // namespace lmscale::model
