#pragma once
// AdamW (docs/architecture.md §2) over a contiguous range of the flat parameter buffer: the whole model for
// plain and DDP training, this rank's shard for ZeRO. State m, v has the master dtype and the
// range's size, so its bytes are exactly what the optimizer state costs this rank. Element-wise:
// it needs no parameter segments and no norms.
#include <cstdint>

#include "lmscale/optim/optimizer.h"

namespace lmscale::optim {

// The per-step arguments of ops::adamw / ops::adamw_host for step t (1-based) of optim's AdamW.
ops::AdamWStep adamw_hyper(const OptimConfig& cfg, std::int64_t t, double lr, double grad_scale);

class AdamW final : public Optimizer {
 public:
  // State zeroed on ctx's device.
  AdamW(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx);

  std::string name() const override { return "adamw"; }
  // The step in pieces (gradients kept per bucket): begin_step() once, then step_range() for
  // elements [offset, offset + params.numel()) of the state, every element exactly once.
  void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                  double grad_scale) override;
  void step_pieces(Context& ctx, Tensor& params, const std::vector<ops::GradPiece>& pieces, Tensor* lowp,
                   std::int64_t offset, double lr, double grad_scale) override;

  Tensor& m() { return state(0); }
  Tensor& v() { return state(1); }

  // A step captured as a CUDA graph (train.cuda_graphs, ops/device_step.h): while set, the
  // kernels read lr, t and the clipped gradient scale from these device tensors (f32
  // [ops::kAdamWScalars], f64 [ops::kClipSlots]) instead of step_range's arguments. Null: off.
  void set_device_step(const Tensor* scalars, const Tensor* clip) {
    device_scalars_ = scalars;
    device_clip_ = clip;
  }
  void set_fp8_weight_casts(const std::vector<ops::Fp8WeightCast>* casts) override { fp8_casts_ = casts; }

 private:
  ops::AdamWStep hyper(double lr, double grad_scale) const;   // this step's scalars
  OptimConfig cfg_;
  const Tensor* device_scalars_ = nullptr;
  const Tensor* device_clip_ = nullptr;
  const std::vector<ops::Fp8WeightCast>* fp8_casts_ = nullptr;
};

}  // namespace lmscale::optim
