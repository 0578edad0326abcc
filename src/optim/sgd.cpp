#include "lmscale/optim/sgd.h"

#include "lmscale/ops/optimizer_steps.h"

namespace lmscale::optim {

Sgd::Sgd(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx) : Optimizer(numel, 0, {}), cfg_(cfg) {
  add_state("momentum_buffer", dtype, ctx);
}

void Sgd::step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                     double grad_scale) {
  const std::int64_t n = params.numel();
  check_range("SGD", offset, n, grads.numel());
  ops::MomentumStep s;
  s.momentum = cfg_.momentum;
  s.weight_decay = cfg_.weight_decay;
  s.grad_scale = grad_scale;
  s.coeff = 1.0;
  s.step = lr;
  s.nesterov = cfg_.nesterov;
  Tensor buf = state(0).flat_range(offset, n);
  Tensor g = grads.reshape({n});
  Tensor p = params.reshape({n});
  ops::momentum_update(ctx, p, g, buf, s, lowp);
}

}  // namespace lmscale::optim
