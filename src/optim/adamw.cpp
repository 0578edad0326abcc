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
  LMSCALE_CHECK(params.numel() == m_.numel(), "AdamW state holds {} elements, got {}", m_.numel(), params.numel());
  begin_step();
  step_range(ctx, params, grads, lowp, 0, lr, grad_scale);
}

void AdamW::step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset,
                       double lr, double grad_scale) {
  const std::int64_t n = params.numel();
  LMSCALE_CHECK(grads.numel() == n && offset >= 0 && offset + n <= m_.numel() && t_ >= 1,
                "AdamW range [{}, {}) of {} elements (grads {}, step {})", offset, offset + n, m_.numel(), grads.numel(), t_);
  ops::AdamWStep a;
  a.lr = lr;
  a.beta1 = cfg_.beta1;
  a.beta2 = cfg_.beta2;
  a.eps = cfg_.eps;
  a.weight_decay = cfg_.weight_decay;
  a.step = t_;
  a.grad_scale = grad_scale;
  Tensor m = m_.flat_range(offset, n), v = v_.flat_range(offset, n);
  Tensor g = grads.reshape({n});
  Tensor p = params.reshape({n});
  ops::adamw(ctx, p, g, m, v, a, lowp);
}

}  // namespace lmscale::optim
