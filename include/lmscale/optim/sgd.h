#pragma once
// SGD with momentum, torch.optim.SGD semantics (dampening 0): weight decay is L2-coupled (added to
// the gradient, g += wd p, before the momentum), buf = momentum buf + g (buf = g on the first
// step), and the step is lr * buf, or lr * (g + momentum buf) with Nesterov. One state tensor,
// momentum_buffer. Element-wise: no segments, no norms.
#include "lmscale/optim/optimizer.h"

namespace lmscale::optim {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx);
  std::string name() const override { return "sgd"; }
  void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                  double grad_scale) override;

 private:
  OptimConfig cfg_;
};

}  // namespace lmscale::optim
