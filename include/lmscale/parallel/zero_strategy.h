#pragma once
// ZeRO stage 1 and 2 over the data-parallel group (parallel/zero.h, docs/architecture.md §4):
// every rank holds the whole store's master and working copy, and the optimizer state of its
// range of the flat buffer only (parallel.offload with a working copy: the working copy, the fp32
// norm weights, and its range's master and state on the host; Spec::master_in_store). zero1 and zero1-broadcast keep one flat gradient buffer; zero2
// keeps lazy buckets, each reduce-scattered as the backward finishes it.
// parallel.overlap_param_gather (zero1/zero2, no tp, no pp): step() leaves the parameter
// all-gather in flight in segments of parallel.bucket_mb, which the next forward waits for unit by
// unit (parallel/unit_waits.h). parallel.offload: step() leaves the whole gather to the next
// forward, unit by unit, each unit's issued once its host update has landed (parallel/zero.h,
// gather_per_unit).
#include <memory>
#include <vector>

#include "lmscale/parallel/strategy.h"
#include "lmscale/parallel/unit_waits.h"
#include "lmscale/parallel/zero.h"

namespace lmscale::parallel {

class ZeroStrategy final : public Strategy {
 public:
  explicit ZeroStrategy(const StrategyParts& parts);
  ~ZeroStrategy() override;

  GradientSync& sync() override { return zero_->sync(); }
  model::ParallelContext forward_hooks(bool training) override;
  double grad_sum_squares(Context& ctx) override;
  void step(Context& ctx, double lr, double grad_scale) override;
  void settle() override;
  bool work_in_flight() const override { return !waits_.empty(); }
  std::vector<float> master_parameters(Context& ctx) override;
  void set_master_parameters(Context& ctx, const std::vector<float>& values) override;
  StateLayout state_layout() override;
  std::int64_t optimizer_steps() const override { return zero_->steps(); }
  void set_optimizer_steps(std::int64_t steps) override;
  std::size_t state_bytes() const override { return zero_->state_bytes(); }
  ShardedOptimizer* sharded() override { return zero_.get(); }
  std::size_t param_gather_segments() const override { return gather_segments_.size(); }

 private:
  ops::Runtime& rt_;
  std::unique_ptr<ZeroOptimizer> zero_;
  std::vector<UnitSegment> gather_segments_;   // overlap_param_gather: in forward order
  int gather_units_ = 0;   // parallel.offload: the forward units, each gathered by the next forward
  UnitWaits waits_;
};

}  // namespace lmscale::parallel
