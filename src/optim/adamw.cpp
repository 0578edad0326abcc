#include "lmscale/optim/adamw.h"

#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"

namespace lmscale::optim {

AdamW::AdamW(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx) : cfg_(cfg) {
  m_ = Tensor::empty({numel}, dtype, *ctx.allocator, "optimizer_state");
  v_ = Tensor::empty({numel}, dtype, *ctx.allocator, "optimizer_state");
  ops::fill(ctx, m_, 0.0);
  ops::fill(ctx, v_, 0.0);
}

void AdamW::step(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, double lr, double grad_scale) {
  LMSCALE_CHECK(params.numel() == m_.numel() && grads.numel() == m_.numel(), "AdamW state holds {} elements, got {}",
                m_.numel(), params.numel());
  ++t_;
  ops::AdamWStep a;
  a.lr = lr;
  a.beta1 = cfg_.beta1;
  a.beta2 = cfg_.beta2;
  a.eps = cfg_.eps;
  a.weight_decay = cfg_.weight_decay;
  a.step = t_;
  a.grad_scale = grad_scale;
  ops::adamw(ctx, params, grads, m_, v_, a, lowp);
}

}  // namespace lmscale::optim
