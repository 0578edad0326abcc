#pragma once
// Every rank holds the whole store and the whole optimizer state (docs/architecture.md §4):
//   one process (dp 1)  gradients in lazy buckets (parallel/grad_buckets.h), allocated as the
//                       backward frees activations, freed after the step; no synchronisation.
//   DDP (dp > 1)        one flat fp32 gradient buffer, reduced by parallel/ddp.h (naive, flat,
//                       overlap, bucketed; bf16 or copy-engine exchange).
// parallel.overlap_optimizer (CUDA, no tp, no pp): the update runs on the runtime's side stream in
// segments (the lazy buckets, or the same 256 MiB split of the flat buffer), each marked so the
// next forward waits only for the units it reads (parallel/unit_waits.h); same kernels on the same
// inputs, so results are unchanged.
#include <memory>
#include <vector>

#include "lmscale/parallel/grad_buckets.h"
#include "lmscale/parallel/offloaded_shards.h"
#include "lmscale/parallel/strategy.h"
#include "lmscale/parallel/unit_waits.h"

namespace lmscale::parallel {

class ReplicatedStrategy final : public Strategy {
 public:
  explicit ReplicatedStrategy(const StrategyParts& parts);
  ~ReplicatedStrategy() override;

  GradientSync& sync() override { return *sync_; }
  model::ParallelContext forward_hooks(bool training) override;
  double grad_sum_squares(Context& ctx) override;
  Tensor grad_square_parts(Context& ctx) override;   // one process without tp only
  void step(Context& ctx, double lr, double grad_scale) override;
  void release_gradients() override;
  void settle() override;
  bool work_in_flight() const override { return !waits_.empty(); }
  std::vector<float> master_parameters(Context& ctx) override;
  void set_master_parameters(Context& ctx, const std::vector<float>& values) override;
  StateLayout state_layout() override;
  std::int64_t optimizer_steps() const override { return optimizer().steps(); }
  void set_optimizer_steps(std::int64_t steps) override;
  std::size_t state_bytes() const override { return optimizer().state_bytes(); }
  optim::Optimizer* whole_optimizer() override { return &optimizer(); }
  void set_fp8_weight_casts(model::Fp8WeightCasts* casts) override;

 private:
  optim::Optimizer& optimizer() const;
  void step_offloaded(Context& ctx, double lr, double grad_scale);

  ops::Runtime& rt_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<LazyGradients> lazy_;   // one process only
  std::unique_ptr<optim::Optimizer> optimizer_;      // on the device, or null when offloaded
  std::unique_ptr<OffloadedShards> offloaded_;       // parallel.offload = optimizer (one process)
  int layers_ = 0;
  bool overlap_ = false;
  std::vector<UnitSegment> segments_;     // the update's segments (lazy buckets or the 256 MiB split)
  UnitWaits waits_;
  model::Fp8WeightCasts* fp8_casts_ = nullptr;   // the step casts these FP8 weights (or null)
};

}  // namespace lmscale::parallel
