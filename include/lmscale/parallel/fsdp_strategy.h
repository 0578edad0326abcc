#pragma once
// Fully sharded data parallelism over the data-parallel group (parallel/fsdp.h,
// docs/architecture.md §4): the store holds no flat buffers; each rank holds its shards of every
// unit's weights, gradients and optimizer state, and the model reaches the gathered weights
// through the store's providers, which FullyShardedDataParallel installs.
#include <memory>

#include "lmscale/parallel/fsdp.h"
#include "lmscale/parallel/strategy.h"

namespace lmscale::parallel {

class FsdpStrategy final : public Strategy {
 public:
  explicit FsdpStrategy(const StrategyParts& parts);
  ~FsdpStrategy() override;

  GradientSync& sync() override { return fsdp_->sync(); }
  bool communicates_in_forward() const override { return true; }   // the units' all-gathers
  double grad_sum_squares(Context& ctx) override;
  void step(Context& ctx, double lr, double grad_scale) override { fsdp_->step(ctx, lr, grad_scale); }
  std::vector<float> master_parameters(Context& ctx) override { return fsdp_->full_parameters(ctx); }
  void set_master_parameters(Context& ctx, const std::vector<float>& values) override {
    fsdp_->set_parameters(ctx, values);
  }
  StateLayout state_layout() override { return fsdp_->state_layout(); }
  std::int64_t optimizer_steps() const override { return fsdp_->steps(); }
  void set_optimizer_steps(std::int64_t steps) override { fsdp_->set_steps(steps); }
  std::size_t state_bytes() const override { return fsdp_->state_bytes(); }
  ShardedOptimizer* sharded() override { return fsdp_.get(); }
  FullyShardedDataParallel* fsdp() override { return fsdp_.get(); }

 private:
  std::unique_ptr<FullyShardedDataParallel> fsdp_;
};

}  // namespace lmscale::parallel
