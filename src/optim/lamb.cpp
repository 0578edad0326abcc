#include "lmscale/optim/lamb.h"

#include <cmath>

#include "lmscale/core/error.h"
#include "lmscale/ops/optimizer_steps.h"

namespace lmscale::optim {

namespace {
std::vector<ParamSegment> or_whole(std::vector<ParamSegment> s, std::int64_t numel) {
  if (s.empty()) s.push_back({0, numel, 0, true});
  return s;
}
}  // namespace

Lamb::Lamb(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx, int num_params,
           std::vector<ParamSegment> segments)
    : Optimizer(numel, std::max(num_params, 1), or_whole(std::move(segments), numel)), cfg_(cfg) {
  add_state("m", dtype, ctx);
  add_state("v", dtype, ctx);
  ratio_.assign(static_cast<std::size_t>(num_params_), 1.0);
  adapted_.assign(static_cast<std::size_t>(num_params_), 0);
  for (const auto& s : segments_) adapted_[static_cast<std::size_t>(s.param)] = s.layerwise ? 1 : 0;
}

void Lamb::accumulate_norms(Context& ctx, const Tensor& params, const Tensor& grads, std::int64_t offset,
                            double grad_scale, std::vector<double>& sums) {
  const std::int64_t n = params.numel();
  check_range("LAMB", offset, n, grads.numel());
  LMSCALE_CHECK(sums.size() == norm_slots(), "LAMB norm sums: {} slots, expected {}", sums.size(), norm_slots());
  ops::LambStep a;
  a.beta1 = cfg_.beta1;
  a.beta2 = cfg_.beta2;
  a.eps = cfg_.eps;
  a.grad_scale = grad_scale;
  a.step = t_;
  Tensor m = state(0).flat_range(offset, n), v = state(1).flat_range(offset, n);
  ops::lamb_moments(ctx, grads.reshape({n}), m, v, a);
  std::vector<ops::Span> spans;
  std::vector<int> owner;
  for (const auto& s : segments_in(offset, n)) {
    if (!s.layerwise) continue;
    spans.push_back({s.offset, s.numel});
    owner.push_back(s.param);
  }
  const auto part = ops::lamb_norms(ctx, params.reshape({n}), m, v, a, spans);
  for (std::size_t i = 0; i < owner.size(); ++i)
    for (int k = 0; k < 3; ++k) sums[static_cast<std::size_t>(kNormSlots * owner[i] + k)] += part[3 * i + static_cast<std::size_t>(k)];
}

void Lamb::set_norms(const std::vector<double>& sums) {
  LMSCALE_CHECK(sums.size() == norm_slots(), "LAMB norm sums: {} slots, expected {}", sums.size(), norm_slots());
  const double wd = cfg_.weight_decay;
  for (int p = 0; p < num_params_; ++p) {
    const double ww = sums[static_cast<std::size_t>(kNormSlots * p)];
    const double rr = sums[static_cast<std::size_t>(kNormSlots * p + 1)];
    const double rw = sums[static_cast<std::size_t>(kNormSlots * p + 2)];
    // ||r + wd w||^2 expanded (a tiny negative from rounding is 0).
    const double uu = std::max(0.0, rr + 2 * wd * rw + wd * wd * ww);
    ratio_[static_cast<std::size_t>(p)] =
        adapted_[static_cast<std::size_t>(p)] ? lamb_trust_ratio(std::sqrt(ww), std::sqrt(uu)) : 1.0;
  }
  norms_step_ = t_;
}

void Lamb::step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                      double grad_scale) {
  const std::int64_t n = params.numel();
  check_range("LAMB", offset, n, grads.numel());
  LMSCALE_CHECK(norms_step_ == t_, "LAMB step {}: accumulate_norms/set_norms were not called for this step", t_);
  Tensor p = params.reshape({n});
  for (const auto& s : segments_in(offset, n)) {
    ops::LambStep a;
    a.beta1 = cfg_.beta1;
    a.beta2 = cfg_.beta2;
    a.eps = cfg_.eps;
    a.grad_scale = grad_scale;
    a.step = t_;
    a.weight_decay = s.layerwise ? cfg_.weight_decay : 0.0;
    a.lr_ratio = lr * (s.layerwise ? ratio_[static_cast<std::size_t>(s.param)] : 1.0);
    Tensor ps = p.flat_range(s.offset, s.numel);
    Tensor m = state(0).flat_range(offset + s.offset, s.numel), v = state(1).flat_range(offset + s.offset, s.numel);
    Tensor low;
    if (lowp) low = lowp->reshape({n}).flat_range(s.offset, s.numel);
    ops::lamb_update(ctx, ps, m, v, a, lowp ? &low : nullptr);
  }
}

}  // namespace lmscale::optim
