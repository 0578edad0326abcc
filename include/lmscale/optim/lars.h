#pragma once
// LARS (You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks", Algorithm 1)
// per parameter w with gradient g (already scaled):
//   local_lr = eta ||w|| / (||g|| + wd ||w||)      (1 when ||w|| = 0 or the denominator is 0)
//   buf = momentum buf + lr * local_lr * (g + wd w);   w -= buf
// eta = optim.trust_coefficient (default 0.001), momentum = optim.momentum, wd = optim.weight_decay;
// the global LR (schedule) multiplies inside the momentum as in the paper's gamma_t.
// RMSNorm gains are excluded (local_lr 1, no decay), like the LAMB paper's bias/LayerNorm rule;
// embeddings and the LM head are adapted like every other matrix.
// The norms are over WHOLE parameters: accumulate_norms adds this rank's partial sums of squares
// (optimizer.h), the caller all-reduces them. One state tensor, momentum_buffer.
#include <vector>

#include "lmscale/optim/optimizer.h"

namespace lmscale::optim {

class Lars final : public Optimizer {
 public:
  Lars(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx, int num_params,
       std::vector<ParamSegment> segments);
  std::string name() const override { return "lars"; }
  bool layerwise() const override { return true; }
  void accumulate_norms(Context& ctx, const Tensor& params, const Tensor& grads, std::int64_t offset,
                        double grad_scale, std::vector<double>& sums) override;
  void set_norms(const std::vector<double>& sums) override;
  void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                  double grad_scale) override;
  // Trust ratio of a parameter in this step (after set_norms).
  double trust_ratio(int param) const { return ratio_[static_cast<std::size_t>(param)]; }

 private:
  OptimConfig cfg_;
  std::vector<double> ratio_;   // per parameter
  std::int64_t norms_step_ = 0;
};

}  // namespace lmscale::optim
