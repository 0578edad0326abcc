#pragma once
// parallel.ep > 1 (docs/parallel.md, "Expert parallelism"): a data-parallel strategy (one process,
// DDP, zero1, zero2, fsdp: make_strategy's choice for parallel.zero) over the expert_dp group of
// dp / ep ranks, wrapped so that
//   - the dense gradients are summed over the ep group first, as each becomes final in the last
//     micro-batch's backward (before the inner strategy's hook starts its own reduction; on GPUs,
//     where no hook reads it during the backward, without waiting: finish() waits once), so a
//     dense gradient is summed over all dp ranks and an expert gradient over the dp / ep replicas
//     of its experts. Under fsdp a unit's full-size gradients are reduce-scattered after every
//     micro-batch (GradientSync::reduces_every_micro_batch): their dense parts are summed over ep
//     in every micro-batch, in on_grad_ready, which the model calls before the unit's
//     after_backward starts the reduce-scatter; the replicated norms accumulate and are summed in
//     the last one;
//   - the gradient norm counts every element once (ExpertParallel::global_sum_squares);
//   - checkpoints: the dense parameters are the same on every ep rank, so only ep rank 0's
//     replicas write them; each ep rank writes its own experts' rows (full-model coordinates, so
//     any ep resumes any other's checkpoint);
//   - host scalars (token counts, flags) are summed over the whole dp group.
// The inner strategy shards (ZeRO, FSDP) over expert_dp: the dense optimizer state (and under fsdp
// the dense master weights) is then held by the ep ranks alike (each a 1 / (dp / ep) shard), the
// experts' by their replicas. FSDP's units then hold a block's dense weights and this ep rank's
// experts together; its gathers run over expert_dp, the all-to-alls over ep.
#include <memory>

#include "lmscale/parallel/expert_parallel.h"
#include "lmscale/parallel/strategy.h"

namespace lmscale::parallel {

class ExpertParallelStrategy final : public Strategy {
 public:
  // parts: the whole layout (spec.dp = the full dp); inner: built over the expert_dp group;
  // dp_host: the full dp group on the host communicator.
  ExpertParallelStrategy(const StrategyParts& parts, std::unique_ptr<Strategy> inner, ExpertParallel& ep,
                         comm::Communicator& dp_host);
  ~ExpertParallelStrategy() override;

  GradientSync& sync() override;
  model::ParallelContext forward_hooks(bool training) override { return inner_->forward_hooks(training); }
  bool communicates_in_forward() const override { return inner_->communicates_in_forward(); }
  double grad_sum_squares(Context& ctx) override;
  void step(Context& ctx, double lr, double grad_scale) override { inner_->step(ctx, lr, grad_scale); }
  void release_gradients() override { inner_->release_gradients(); }
  void settle() override { inner_->settle(); }
  bool work_in_flight() const override { return inner_->work_in_flight(); }
  std::vector<float> master_parameters(Context& ctx) override { return inner_->master_parameters(ctx); }
  void set_master_parameters(Context& ctx, const std::vector<float>& values) override {
    inner_->set_master_parameters(ctx, values);
  }
  StateLayout state_layout() override;
  std::int64_t optimizer_steps() const override { return inner_->optimizer_steps(); }
  void set_optimizer_steps(std::int64_t steps) override { inner_->set_optimizer_steps(steps); }
  std::size_t state_bytes() const override { return inner_->state_bytes(); }
  optim::Optimizer* whole_optimizer() override { return inner_->whole_optimizer(); }
  ShardedOptimizer* sharded() override { return inner_->sharded(); }
  std::size_t param_gather_segments() const override { return inner_->param_gather_segments(); }
  FullyShardedDataParallel* fsdp() override { return inner_->fsdp(); }

 private:
  class Sync;
  std::unique_ptr<Strategy> inner_;
  ExpertParallel& ep_;
  std::unique_ptr<Sync> sync_;
};

}  // namespace lmscale::parallel
