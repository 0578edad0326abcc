#pragma once
// What the trainer needs from a strategy that owns the optimizer state of a sharded layout (ZeRO
// 1/2, FSDP): the gradient synchronisation it drives during the backward, the global gradient
// norm over the shards, the optimizer step of this rank's shard, and the state's size.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/error.h"
#include "lmscale/parallel/gradient_sync.h"

namespace lmscale::parallel {

class ShardedOptimizer {
 public:
  virtual ~ShardedOptimizer() = default;
  virtual GradientSync& sync() = 0;
  // Sum of squares of the global (summed over ranks) gradient, after sync().finish(); every
  // element counted once however many ranks hold it.
  virtual double grad_sum_squares(Context& ctx) = 0;
  // The same restricted to element ranges (offset, numel) of the model's flat layout (the first
  // group): tensor parallelism counts the replicated norm weights apart.
  virtual double grad_sum_squares_in(Context& ctx, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
    (void)ctx;
    (void)ranges;
    throw Error("this sharded optimizer cannot restrict the gradient norm to parameter ranges");
  }
  // Layer-wise optimizers (LARS, LAMB): called on the per-parameter norm sums of the model's
  // group after they are summed over this strategy's data-parallel ranks, for a further reduction
  // over other ranks that hold slices of the same parameters (tensor parallelism).
  using NormReducer = std::function<void(std::vector<double>& sums)>;
  void set_norm_reducer(NormReducer r) { norm_reducer_ = std::move(r); }
  // One optimizer step of what this rank owns, grad_scale times the gradients (1/loss scale and the
  // clipping factor), leaving every rank with the parameters its next forward needs.
  virtual void step(Context& ctx, double lr, double grad_scale) = 0;
  // Makes the master (fp32) parameters whole on every rank where step() left only this rank's
  // range current (ZeRO with a low-precision working copy gathers the copy, not the master).
  // Collective; a no-op when they are whole already. Called before the master is read whole
  // (full_parameters: checkpoints, pruning, tests).
  virtual void complete_master(Context& ctx) { (void)ctx; }
  virtual std::size_t state_bytes() const = 0;   // this rank's optimizer state
  virtual std::int64_t steps() const = 0;

 protected:
  NormReducer norm_reducer_;
};

}  // namespace lmscale::parallel
