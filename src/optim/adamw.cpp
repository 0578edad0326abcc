#include "lmscale/optim/adamw.h"

#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"

namespace lmscale::optim {

AdamW::AdamW(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx)
    : Optimizer(numel, 0, {}), cfg_(cfg) {
  add_state("m", dtype, ctx);
  add_state("v", dtype, ctx);
}

ops::AdamWStep adamw_hyper(const OptimConfig& cfg, std::int64_t t, double lr, double grad_scale) {
  ops::AdamWStep a;
  a.lr = lr;
  a.beta1 = cfg.beta1;
  a.beta2 = cfg.beta2;
  a.eps = cfg.eps;
  a.weight_decay = cfg.weight_decay;
  a.step = t;
  a.grad_scale = grad_scale;
  return a;
}

ops::AdamWStep AdamW::hyper(double lr, double grad_scale) const {
  ops::AdamWStep a = adamw_hyper(cfg_, t_, lr, grad_scale);
  a.device_scalars = device_scalars_;
  a.device_clip = device_clip_;
  a.fp8_casts = fp8_casts_;
  return a;
}

void AdamW::step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset,
                       double lr, double grad_scale) {
  const std::int64_t n = params.numel();
  check_range("AdamW", offset, n, grads.numel());
  const ops::AdamWStep a = hyper(lr, grad_scale);
  Tensor m = this->m().flat_range(offset, n), v = this->v().flat_range(offset, n);
  Tensor g = grads.reshape({n});
  Tensor p = params.reshape({n});
  ops::adamw(ctx, p, g, m, v, a, lowp);
}

void AdamW::step_pieces(Context& ctx, Tensor& params, const std::vector<ops::GradPiece>& pieces, Tensor* lowp,
                        std::int64_t offset, double lr, double grad_scale) {
  const std::int64_t n = params.numel();
  check_range("AdamW", offset, n, n);
  Tensor m = this->m().flat_range(offset, n), v = this->v().flat_range(offset, n);
  Tensor p = params.reshape({n});
  ops::adamw_pieces(ctx, p, pieces, m, v, hyper(lr, grad_scale), lowp);
}

}  // namespace lmscale::optim
