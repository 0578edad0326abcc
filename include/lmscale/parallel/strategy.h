#pragma once
// A data-parallel strategy (docs/architecture.md §4): what parallel.zero and parallel.ddp mean, in
// one object the trainer holds without asking which one it is. make_strategy() picks the
// implementation from the resolved parallel::Spec once:
//
//   one process, DDP (naive | flat | overlap | bucketed)   replicated_strategy.h
//   zero1, zero1-broadcast, zero2                           zero_strategy.h
//   fsdp                                                    fsdp_strategy.h
//   any of the first two with parallel.ep > 1               expert_parallel_strategy.h around it
//
// Each composes with tensor parallelism (the store then holds this tp rank's slices; norms count
// once over tp) and, except fsdp, with pipeline parallelism (the store holds this stage's units).
// A strategy owns the gradient synchronisation the model's hooks drive, the gradient norm's
// partial sums, the optimizer step over what this rank owns, the work it leaves in flight for the
// next forward, and the layout of its state for checkpoints.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/io/config.h"
#include "lmscale/model/fp8_weight_casts.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/optim/optimizer.h"
#include "lmscale/parallel/gradient_sync.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/parallel/state_layout.h"

namespace lmscale::parallel {

class TensorParallel;
class ExpertParallel;
class FullyShardedDataParallel;
class ShardedOptimizer;

// What a strategy is built over: the trainer's store and the data-parallel group of its mesh.
struct StrategyParts {
  const Config& cfg;
  Spec spec;                           // spec.dp: the size of the data-parallel group below
  ops::Runtime& rt;
  model::ParameterStore& store;        // built with Buffers for spec.grad_storage()
  int layers = 0;                      // the model's blocks (unit numbering: 0 embedding, l+1, L+1 head)
  comm::Communicator* dp = nullptr;    // the data-parallel group (device communicator); null when dp = 1
  comm::Communicator* dp_host = nullptr;   // the same ranks on the host communicator
  int dp_rank = 0;
  TensorParallel* tp = nullptr;        // null without tensor parallelism
  bool pipeline = false;               // parallel.pp > 1
  // Expert parallelism (spec.ep > 1): the ep group, and the expert_dp group (dp / ep ranks; null
  // when that is one rank) with this rank's index in it, over which the strategy reduces.
  ExpertParallel* ep = nullptr;
  comm::Communicator* expert_dp = nullptr;
  comm::Communicator* expert_dp_host = nullptr;
  int expert_dp_rank = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // The gradient synchronisation the model's backward hooks drive (GradientSync::hooks).
  virtual GradientSync& sync() = 0;
  // A forward's hooks (training: its backward follows), with the waits for the work the last
  // step left in flight in front of each unit's forward.
  virtual model::ParallelContext forward_hooks(bool training) { return sync().forward_hooks(training); }
  // parallel.comm_sms: whether this strategy's collectives run beside the forward's GEMMs (fsdp's
  // all-gathers); every strategy with dp > 1 reduces gradients beside the backward's.
  virtual bool communicates_in_forward() const { return false; }
  bool communicates_in_backward() const { return spec_.dp > 1; }

  // Sum of squares of the global gradient after sync().finish(), every element counted once
  // (summed over the dp ranks that hold shards, the tp slices added, tp-replicated norms once).
  virtual double grad_sum_squares(Context& ctx) = 0;
  // The same sum left on the device in parts, with no wait (optim::sum_of_squares_parts: the host
  // sum of the parts in index order is grad_sum_squares): a step captured as a CUDA graph clips
  // from it on the device (ops/device_step.h). Only strategies a captured step runs (one process)
  // have it; the others throw.
  virtual Tensor grad_square_parts(Context& ctx);
  // One optimizer step over what this rank owns; grad_scale = 1/loss scale x the clip factor.
  // May leave work in flight that the next forward waits for unit by unit (forward_hooks).
  virtual void step(Context& ctx, double lr, double grad_scale) = 0;
  // The step's gradients are no longer needed (after a skipped step; freed per bucket by the next
  // forward when step() left an update in flight).
  virtual void release_gradients() {}
  // Makes the compute stream wait for everything step() left in flight (before the parameters or
  // the optimizer state are read outside a forward). A no-op when nothing is pending.
  virtual void settle() {}
  // Whether step() left per-unit waits for the next forward (an overlapped update, deferred
  // parameter gathers, an offloaded update's copies up) that settle() would make now. Not the
  // host worker of an offloaded update itself, which settle() also waits for.
  virtual bool work_in_flight() const { return false; }

  // This rank's store (its tp slices, its stage) as fp32 values in the store's flat layout,
  // whole on every rank of the dp group (collective under fsdp and ZeRO), and back.
  virtual std::vector<float> master_parameters(Context& ctx);
  virtual void set_master_parameters(Context& ctx, const std::vector<float>& values);

  // Checkpoints: the pieces of named parameters this rank saves and loads (state_layout.h).
  virtual StateLayout state_layout() = 0;
  virtual std::int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(std::int64_t steps) = 0;
  // Bytes of this rank's optimizer state.
  virtual std::size_t state_bytes() const = 0;

  // The optimizer over the whole store (one process, DDP), else null: whole-file checkpoints
  // with optimizer state read it.
  virtual optim::Optimizer* whole_optimizer() { return nullptr; }
  virtual ShardedOptimizer* sharded() { return nullptr; }
  virtual FullyShardedDataParallel* fsdp() { return nullptr; }
  // The FP8 GEMM weights this strategy's optimizer step casts (precision.fp8_weight_casts =
  // optimizer; model/fp8_weight_casts.h), for the strategies of step_casts_fp8_weights only (the
  // others throw). Null: each forward casts.
  virtual void set_fp8_weight_casts(model::Fp8WeightCasts* casts);
  // parallel.overlap_param_gather: the parameter all-gather segments each step leaves in flight.
  virtual std::size_t param_gather_segments() const { return 0; }

  const Spec& spec() const { return spec_; }

 protected:
  explicit Strategy(const StrategyParts& parts)
      : spec_(parts.spec), store_(parts.store), tp_(parts.tp), dp_rank_(parts.dp_rank) {}
  // Where this rank sits among the holders of the same state: the near-equal slice of a
  // replicated parameter it writes (tp-replicated norms: split over dp x tp).
  std::pair<std::int64_t, std::int64_t> writer_slice(const model::ParamInfo& p) const;
  bool tp_replicated(const model::ParamInfo& p) const;
  // A sharded optimizer's global sum of squares (every element once over dp) made global over
  // tp too: the sliced parameters' squares add over the tp ranks, the replicated norm weights
  // (identical on every tp rank) count once.
  double sharded_sum_squares(Context& ctx, ShardedOptimizer& sharded) const;

  Spec spec_;
  model::ParameterStore& store_;
  TensorParallel* tp_;
  int dp_rank_;
};

// The strategy of parts.spec (the only place that maps parallel.zero to an implementation).
std::unique_ptr<Strategy> make_strategy(const StrategyParts& parts);

// Whether the optimizer step of this layout casts the FP8 GEMM weights (precision.fp8_weight_casts
// = optimizer; docs/precision.md, "Weights cast by the optimizer step"): precision.mode = fp8 with
// delayed scaling on CUDA; one process or DDP, whose step updates the whole store in one pass on
// the compute stream (not offloaded, not overlapped), with AdamW; one micro-batch per step (each
// forward of an accumulating step would record the weights' amax again); d_model and d_ff
// multiples of 64 (the casts' tiles); a job that steps (bench-model's forward and forward-backward
// modes never do). Elsewhere each forward casts.
bool step_casts_fp8_weights(const Config& cfg, const Spec& spec, std::int64_t grad_accum, Device device);

}  // namespace lmscale::parallel
