#pragma once
// Fully sharded data parallelism (ZeRO-3, docs/architecture.md §4) over the data-parallel group.
//
// The model's units (model/parallel_context.h: embedding, blocks, final norm + head) are FSDP's
// units. Each unit's embedding and linear weights, concatenated in parameter order, form one
// region of n_u elements, split into `dp` equal shards of s_u = ceil(n_u / dp) elements (the last
// rank's shard is zero-padded, so the collectives are plain all-gather / reduce-scatter). Rank r
// holds only its shards: fp32 master weights, fp32 gradient shards and the optimizer state of its
// shards. In mixed precision a unit's shard is cast to bf16/fp16 just before its all-gather (the
// low-precision copy is what travels; it lives only until the gather is done, which costs one
// small cast per gather instead of a persistent 2 B/parameter copy). Norm weights stay replicated (fp32 master, fp32 gradients summed
// over the ranks after the backward): a few KiB each, not worth a transfer.
//
// Around each unit's use (the model calls the hooks of sync()):
//   before_forward(u)   gather u unless it is there or in flight, start the gathers of the next
//                       `prefetch` units, make the compute wait for u's gather;
//   after_forward(u)    free u's gathered weights (kept when training with reshard_after_forward
//                       = false, and for the last unit, whose backward follows at once);
//   before_backward(u)  gather u again if it was freed, prefetch the `prefetch` units below;
//   after_backward(u)   free u's weights, reduce-scatter u's full-size gradients (fp32 sum) into
//                       the gradient shard while the backward goes on, and free them once the
//                       reduce-scatter is done. Every micro-batch is reduce-scattered; later
//                       micro-batches add into the shard (no full-size gradient outlives a unit).
// The model reaches the gathered weights and the full-size gradient buffers through the
// ParameterStore's providers (a store with Buffers::none).
//
// With parallel.offload = optimizer the fp32 master and the AdamW state of the shards live in host
// memory and step() hands the update to a host worker (parallel/offloaded_shards.h); the gathers
// then send the device's compute-dtype copy of the shard, each waiting for its unit's update.
// With optimizer+params that copy is on the host (pinned): each gather first copies its unit's
// shard up into a send buffer of its own, freed once the gather is done.
//
// parallel.fsdp_gather_dtype = fp8 (precision.mode = fp8, current scaling; docs/parallel.md "FP8
// weight gathers"): a block's unit holds only its seven FP8 GEMM weights (the norms are replicated,
// outside the units), so its whole shard is cast to e4m3 with per-weight scales from the dp
// group's amax (parallel/fsdp_fp8_gather.h: one all-reduce of 7 amaxes, then the cast) and one
// all-gather moves 1 byte per element; the model's FP8 layers read the gathered e4m3 weights and
// their scales (ParameterStore::fp8_weight) instead of casting them. The embedding's and the
// head's units gather in the compute dtype. One buffer per unit, no mixed sections.
//
// Per unit, the time the compute waited for a gather (forward and backward) is measured: the
// answer to "does the next layer's all-gather finish in time for its forward?".
//
// 2D parallelism (dp x tp mesh): `comm` is the dp axis and the store holds this tp rank's slices
// (model/tensor_parallel.h), so the units' regions are the local slices concatenated: each tp
// rank shards its own slices over its dp group, gathers them over dp ahead of use and
// reduce-scatters their gradients over dp, while the model's Megatron collectives run over tp.
// The norms, replicated over dp and tp, are summed over dp here; their gradients are already
// whole on every tp rank (without sequence parallelism the tp ranks compute them from the same
// replicated activations; with it the model sums each norm's partial gradient over tp).
#include <cstdint>
#include <memory>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/io/config.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/optim/optimizer.h"
#include "lmscale/parallel/fsdp_fp8_gather.h"
#include "lmscale/parallel/offloaded_shards.h"
#include "lmscale/parallel/sharded_optimizer.h"
#include "lmscale/parallel/state_layout.h"

namespace lmscale::parallel {

struct FsdpOptions {
  int prefetch = 1;                    // units gathered ahead of the one computing
  bool reshard_after_forward = true;   // false: keep each unit's weights from its forward to its backward
  // parallel.offload = optimizer: master weights and AdamW state of the shards on the host,
  // updated there by `offload_threads` threads (parallel/offloaded_shards.h).
  bool offload_optimizer = false;
  // parallel.offload = optimizer+params (with offload_optimizer): the 16-bit shard on the host
  // too, copied up per unit before its gather (OffloadedShards::ShardCopy::pinned_host).
  bool offload_params = false;
  // parallel.offload_delayed_update (with offload_params): the forward does not wait for the
  // host update; it reads the update before (OffloadedShards, "the one-step-delayed update").
  bool offload_delayed_update = false;
  int offload_threads = 1;
  // parallel.fsdp_gather_dtype = fp8: the blocks' units gather their FP8 GEMM weights in e4m3
  // (parallel/fsdp_fp8_gather.h), cast with scales of margin fp8_margin (precision.fp8_margin).
  bool gather_fp8 = false;
  int fp8_margin = 0;
  // With gather_fp8: the store indices of weights one FP8 layer reads as one matrix, which share
  // one scale (model::fp8_weight_groups: q|k|v, o, w1|w3, w2); consecutive in their unit.
  // A weight in no group has a scale of its own.
  std::vector<std::vector<int>> fp8_groups;
  static FsdpOptions from(const ParallelConfig& p);
};

class FullyShardedDataParallel final : public ShardedOptimizer {
 public:
  // store: Buffers::none (this object installs its weight and gradient providers). The shards
  // are initialised from (seed, parameter name), as one process would initialise the whole.
  FullyShardedDataParallel(model::ParameterStore& store, comm::Communicator& comm, comm::Communicator& host,
                           const OptimConfig& cfg, const FsdpOptions& opt, std::uint64_t seed, ops::Runtime& rt);
  ~FullyShardedDataParallel() override;
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  GradientSync& sync() override;
  double grad_sum_squares(Context& ctx) override;
  // Restricted to element ranges of the store's flat layout (tensor parallelism: the replicated norms).
  double grad_sum_squares_in(Context& ctx, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) override;
  void step(Context& ctx, double lr, double grad_scale) override;
  std::size_t state_bytes() const override;
  std::int64_t steps() const override;

  // The fp32 parameters in the store's flat layout (ParamInfo offsets), gathered unit by unit over
  // the dp group; collective: every rank calls it and gets them. Under tensor parallelism that is
  // this rank's slices (the trainer gathers them over tp into the full model's layout).
  std::vector<float> full_parameters(Context& ctx);
  // Sets this rank's shards (and the replicated norms) from parameters in that layout.
  void set_parameters(Context& ctx, const std::vector<float>& full);

  // This rank's shards and the replicated norms as pieces of named parameters in the full model's
  // coordinates (checkpoints; state_layout.h). Views stay valid for the object's life.
  StateLayout state_layout();
  void set_steps(std::int64_t t);   // the optimizer step count of shards and norms (on resume)

  int num_units() const { return static_cast<int>(units_.size()); }
  // Milliseconds the compute waited for unit u's gather, summed since reset_waits().
  struct Waits {
    std::vector<double> forward_ms, backward_ms;
    std::int64_t steps = 0;   // backward passes measured
  };
  const Waits& waits() const { return waits_; }
  void reset_waits();

 private:
  class Sync;
  struct Unit {
    std::vector<int> params;               // sharded parameters, in order
    std::vector<std::int64_t> offsets;     // their element offsets in the unit's region
    std::int64_t numel = 0, shard = 0;     // n_u, s_u
    std::int64_t shard_offset = 0;         // where this rank's shard starts in the flat shard buffers
  };
  enum class State { released, in_flight, ready };
  struct Gathered {
    Tensor buffer;   // [dp * s_u] compute dtype (fp8_e4m3 for a unit gathered in FP8)
    Tensor send;     // [s_u] the shard cast to the compute dtype (mixed precision) or copied up from
                     // the host (optimizer+params), until gathered; a unit gathered in FP8: the
                     // e4m3 cast of it [s_u]
    Tensor staged;   // FP8 with optimizer+params: the copied-up shard, kept as send keeps it
    comm::Work work;
    State state = State::released;
  };
  struct PendingReduction {
    comm::Work work;
    Tensor full, temp;   // sent gradients [dp * s_u]; received sum when adding into the shard
    std::int64_t offset = 0, count = 0;
  };

  // Calls fn(param index, first element in the parameter, element count, position in this
  // rank's shard of unit u) for each piece of a parameter that falls into this rank's shard.
  template <class Fn> void for_each_piece(const Unit& u, Fn&& fn) const;
  // A unit's weights as FsdpFp8Scales' scale groups (FsdpOptions::fp8_groups), in slot order.
  std::vector<int> fp8_group_sizes(const Unit& unit, const std::vector<std::vector<int>>& groups) const;
  void issue_gather(int u);
  struct WaitMarks {
    int unit = 0;
    bool backward = false;
    ops::Runtime::Mark before, after;
  };
  void wait_gather(int u, bool backward);
  void release(int u);
  void reduce_scatter(int u);
  void complete_reductions(std::size_t keep_in_flight);
  Tensor weight(int param);
  ops::Fp8Weight fp8_weight(int param);   // a weight of a unit gathered in FP8, with its scales
  Tensor grad(int param);
  // The optimizer over the shards: on the device, or the offloaded one's host AdamW.
  optim::Optimizer& shard_optimizer();
  const optim::Optimizer& shard_optimizer() const;
  // Waits for an offloaded step in flight (before the host master or moments are read or written).
  void settle_offload();
  void collect_waits();

  model::ParameterStore& store_;
  comm::Communicator& comm_;
  comm::Communicator& host_;
  ops::Runtime& rt_;
  FsdpOptions opt_;
  DType compute_;
  std::vector<Unit> units_;
  std::vector<int> unit_of_;          // per parameter; -1 for norms
  std::vector<std::int64_t> local_;   // per parameter: offset in its unit's region, or in the norm buffer
  Tensor master_, grad_shard_;          // this rank's shards [S] (master_ on the host when offloaded)
  std::unique_ptr<OffloadedShards> offloaded_;   // parallel.offload = optimizer
  Tensor norm_master_, norm_grads_;     // replicated norm weights [Nn]
  // optim.name over the shards (segments: the parameter pieces, padding in none) and over the
  // replicated norms (excluded from layer-wise ratios: no reduction needed).
  std::unique_ptr<optim::Optimizer> optimizer_, norm_optimizer_;
  // parallel.fsdp_gather_dtype = fp8, per unit: the scales of a block unit's weights (null for the
  // units gathered in the compute dtype) and this rank's pieces of them in its shard.
  std::vector<std::unique_ptr<FsdpFp8Scales>> fp8_scales_;
  std::vector<std::vector<FsdpFp8Scales::Piece>> fp8_pieces_;
  std::vector<int> slot_;   // per parameter: its position in its unit's params (FsdpFp8Scales::weight)
  std::vector<Gathered> gathered_;
  std::vector<Tensor> unit_grads_;      // full-size gradients of units in their backward
  std::vector<PendingReduction> pending_;
  int micro_ = 0;
  bool training_ = false;
  bool step_open_ = false;   // the step's last backward ran and finish() has not yet
  std::unique_ptr<Sync> sync_;
  // Around each wait of the compute for a gather in this step's training passes.
  std::vector<WaitMarks> marks_;
  Waits waits_;
};

}  // namespace lmscale::parallel
