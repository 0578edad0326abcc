#include "lmscale/optim/lars.h"

#include <cmath>

#include "lmscale/core/error.h"
#include "lmscale/ops/optimizer_steps.h"

namespace lmscale::optim {

namespace {
// No segments (a plain buffer): the whole range is one parameter.
std::vector<ParamSegment> or_whole(std::vector<ParamSegment> s, std::int64_t numel) {
  if (s.empty()) s.push_back({0, numel, 0, true});
  return s;
}
}  // namespace

Lars::Lars(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx, int num_params,
           std::vector<ParamSegment> segments)
    : Optimizer(numel, std::max(num_params, 1), or_whole(std::move(segments), numel)), cfg_(cfg) {
  add_state("momentum_buffer", dtype, ctx);
  ratio_.assign(static_cast<std::size_t>(num_params_), 1.0);
}

void Lars::accumulate_norms(Context& ctx, const Tensor& params, const Tensor& grads, std::int64_t offset,
                            double grad_scale, std::vector<double>& sums) {
  const std::int64_t n = params.numel();
  check_range("LARS", offset, n, grads.numel());
  LMSCALE_CHECK(sums.size() == norm_slots(), "LARS norm sums: {} slots, expected {}", sums.size(), norm_slots());
  std::vector<ops::Span> spans;
  std::vector<int> owner;
  for (const auto& s : segments_in(offset, n)) {
    if (!s.layerwise) continue;
    spans.push_back({s.offset, s.numel});
    owner.push_back(s.param);
  }
  const auto part = ops::lars_norms(ctx, params.reshape({n}), grads.reshape({n}), grad_scale, spans);
  for (std::size_t i = 0; i < owner.size(); ++i)
    for (int k = 0; k < 2; ++k) sums[static_cast<std::size_t>(kNormSlots * owner[i] + k)] += part[2 * i + static_cast<std::size_t>(k)];
}

void Lars::set_norms(const std::vector<double>& sums) {
  LMSCALE_CHECK(sums.size() == norm_slots(), "LARS norm sums: {} slots, expected {}", sums.size(), norm_slots());
  for (int p = 0; p < num_params_; ++p) {
    const double w = std::sqrt(sums[static_cast<std::size_t>(kNormSlots * p)]);
    const double g = std::sqrt(sums[static_cast<std::size_t>(kNormSlots * p + 1)]);
    ratio_[static_cast<std::size_t>(p)] = lars_trust_ratio(w, g, cfg_.trust_coefficient, cfg_.weight_decay);
  }
  norms_step_ = t_;
}

void Lars::step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                      double grad_scale) {
  const std::int64_t n = params.numel();
  check_range("LARS", offset, n, grads.numel());
  LMSCALE_CHECK(norms_step_ == t_, "LARS step {}: set_norms() was not called for this step", t_);
  Tensor p = params.reshape({n}), g = grads.reshape({n});
  for (const auto& s : segments_in(offset, n)) {
    ops::MomentumStep m;
    m.momentum = cfg_.momentum;
    m.weight_decay = s.layerwise ? cfg_.weight_decay : 0.0;
    m.grad_scale = grad_scale;
    m.coeff = lr * (s.layerwise ? ratio_[static_cast<std::size_t>(s.param)] : 1.0);
    m.step = 1.0;
    m.nesterov = false;
    Tensor ps = p.flat_range(s.offset, s.numel), gs = g.flat_range(s.offset, s.numel);
    Tensor buf = state(0).flat_range(offset + s.offset, s.numel);
    Tensor low;
    if (lowp) low = lowp->reshape({n}).flat_range(s.offset, s.numel);
    ops::momentum_update(ctx, ps, gs, buf, m, lowp ? &low : nullptr);
  }
}

}  // namespace lmscale::optim
