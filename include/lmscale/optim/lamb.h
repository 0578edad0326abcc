#pragma once
// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76
// minutes", Algorithm 2) per parameter w with gradient g (already scaled):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  r = (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
//   u = r + wd w;  w -= lr * (||w|| / ||u||) * u    (ratio 1 when ||w|| = 0 or ||u|| = 0)
// with phi the identity, b1, b2, eps, wd from optim.beta1/beta2/eps/weight_decay. RMSNorm gains
// are excluded from the trust ratio and from weight decay (the paper's bias/LayerNorm exclusion);
// embeddings and the LM head are adapted. accumulate_norms updates m and v and adds this rank's
// partial ||w||^2 and ||r||^2, r.w of each parameter (so the update norm needs no second pass
// over the gradients); the caller all-reduces them. State m, v.
#include <vector>

#include "lmscale/optim/optimizer.h"

namespace lmscale::optim {

class Lamb final : public Optimizer {
 public:
  Lamb(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx, int num_params,
       std::vector<ParamSegment> segments);
  std::string name() const override { return "lamb"; }
  bool layerwise() const override { return true; }
  void accumulate_norms(Context& ctx, const Tensor& params, const Tensor& grads, std::int64_t offset,
                        double grad_scale, std::vector<double>& sums) override;
  void set_norms(const std::vector<double>& sums) override;
  // grads are not read (accumulate_norms consumed them into m, v).
  void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                  double grad_scale) override;
  double trust_ratio(int param) const { return ratio_[static_cast<std::size_t>(param)]; }

 private:
  OptimConfig cfg_;
  std::vector<double> ratio_;
  std::vector<char> adapted_;   // per parameter: layer-wise (decay and ratio) or excluded
  std::int64_t norms_step_ = 0;
};

}  // namespace lmscale::optim
