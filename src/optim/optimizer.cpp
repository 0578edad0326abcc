// The optimizer interface's shared parts and the factory (include/lmscale/optim/optimizer.h).
#include "lmscale/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/adamw.h"
#include "lmscale/optim/lamb.h"
#include "lmscale/optim/lars.h"
#include "lmscale/optim/sgd.h"

namespace lmscale::optim {

Optimizer::Optimizer(std::int64_t numel, int num_params, std::vector<ParamSegment> segments)
    : numel_(numel), num_params_(num_params), segments_(std::move(segments)) {
  std::sort(segments_.begin(), segments_.end(),
            [](const ParamSegment& a, const ParamSegment& b) { return a.offset < b.offset; });
  std::int64_t end = 0;
  for (const auto& s : segments_) {
    LMSCALE_CHECK(s.offset >= end && s.numel >= 0 && s.offset + s.numel <= numel_ && s.param >= 0 &&
                      s.param < num_params_,
                  "optimizer segment [{}, {}) of parameter {} overlaps another or lies outside {} elements / {} "
                  "parameters",
                  s.offset, s.offset + s.numel, s.param, numel_, num_params_);
    end = s.offset + s.numel;
  }
}

void Optimizer::add_state(const std::string& name, DType dtype, Context& ctx) {
  Tensor t = Tensor::empty({numel_}, dtype, *ctx.allocator, "optimizer_state");
  ops::fill(ctx, t, 0.0);
  names_.push_back(name);
  states_.push_back(t);
}

std::size_t Optimizer::state_bytes() const {
  std::size_t b = 0;
  for (const auto& t : states_) b += t.nbytes();
  return b;
}

void Optimizer::check_range(const char* who, std::int64_t offset, std::int64_t n, std::int64_t grads) const {
  LMSCALE_CHECK(grads == n && offset >= 0 && offset + n <= numel_ && t_ >= 1,
                "{} range [{}, {}) of {} elements (grads {}, step {})", who, offset, offset + n, numel_, grads, t_);
}

std::vector<ParamSegment> Optimizer::segments_in(std::int64_t offset, std::int64_t n) const {
  std::vector<ParamSegment> out;
  for (const auto& s : segments_) {
    const std::int64_t a = std::max(s.offset, offset), b = std::min(s.offset + s.numel, offset + n);
    if (a < b) out.push_back({a - offset, b - a, s.param, s.layerwise});
  }
  return out;
}

void Optimizer::accumulate_norms(Context&, const Tensor&, const Tensor&, std::int64_t, double, std::vector<double>&) {}
void Optimizer::set_norms(const std::vector<double>&) {}

void Optimizer::set_fp8_weight_casts(const std::vector<ops::Fp8WeightCast>* casts) {
  LMSCALE_CHECK(!casts, "{} does not cast FP8 weights in its step (AdamW does)", name());
}

void Optimizer::step(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, double lr, double grad_scale) {
  LMSCALE_CHECK(params.numel() == numel_, "{} state holds {} elements, got {}", name(), numel_, params.numel());
  begin_step();
  if (layerwise()) {
    std::vector<double> sums(norm_slots(), 0.0);
    accumulate_norms(ctx, params, grads, 0, grad_scale, sums);
    set_norms(sums);
  }
  step_range(ctx, params, grads, lowp, 0, lr, grad_scale);
}

void Optimizer::step_pieces(Context& ctx, Tensor& params, const std::vector<ops::GradPiece>& pieces, Tensor* lowp,
                            std::int64_t offset, double lr, double grad_scale) {
  for (const ops::GradPiece& piece : pieces) {
    const std::int64_t k = piece.grad.numel();
    Tensor p = params.flat_range(piece.offset, k);
    Tensor low;
    if (lowp) low = lowp->flat_range(piece.offset, k);
    step_range(ctx, p, piece.grad, lowp ? &low : nullptr, offset + piece.offset, lr, grad_scale);
  }
}

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx,
                                          int num_params, std::vector<ParamSegment> segments) {
  switch (cfg.name) {
    case OptimizerName::adamw: return std::make_unique<AdamW>(cfg, numel, dtype, ctx);
    case OptimizerName::sgd: return std::make_unique<Sgd>(cfg, numel, dtype, ctx);
    case OptimizerName::lars: return std::make_unique<Lars>(cfg, numel, dtype, ctx, num_params, std::move(segments));
    case OptimizerName::lamb: return std::make_unique<Lamb>(cfg, numel, dtype, ctx, num_params, std::move(segments));
  }
  throw UsageError(fmt::format("optim.name = '{}' is not an optimizer (adamw, sgd, lars, lamb)", cfg.name));
}

double lars_trust_ratio(double w_norm, double g_norm, double eta, double weight_decay) {
  const double denom = g_norm + weight_decay * w_norm;
  if (!(w_norm > 0) || !(denom > 0)) return 1.0;
  return eta * w_norm / denom;
}

double lamb_trust_ratio(double w_norm, double u_norm) {
  if (!(w_norm > 0) || !(u_norm > 0)) return 1.0;
  return w_norm / u_norm;
}

}  // namespace lmscale::optim
