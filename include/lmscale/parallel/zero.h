#pragma once
// Optimizer-state sharding (ZeRO stage 1/2, docs/architecture.md §4). Each parameter group (a flat buffer of
// parameters with its flat gradient buffer; the model is one group) is split into `size`
// contiguous element ranges, as even as element counts allow (sizes differ by at most one
// element); rank r keeps AdamW state only for its range and updates only those parameters.
//   zero1-broadcast - the seed's version: gradients all-reduced (by the DDP strategy), each rank
//                     steps its range, then every range is broadcast from its owner;
//   zero1           - gradients reduce-scattered (each rank receives the sum of its range), step,
//                     parameters all-gathered;
//   zero2           - each bucket of gradients is reduce-scattered as soon as the backward
//                     finishes it (overlapped with the rest of the backward); in the trainer the
//                     gradients live in per-bucket buffers allocated during the backward and freed
//                     after their reduce-scatter, so no rank holds the full-size gradients.
// Groups may be added at any time (add_group): each is sharded on its own, so existing shards and
// their state are untouched. Parameters are exchanged in the working dtype: with a bf16/fp16
// working copy, the optimizer writes the copy of its range (fused, the rounding of ops::cast) and
// zero1/zero2 all-gather the copy (2 bytes per parameter instead of 4); the master's other ranges
// are then stale on this rank until complete_master() gathers them (full_parameters does; the
// optimizer and the sharded checkpoints read only this rank's range, the forward the copy and the
// group's master_reads, the norm weights, which are gathered in fp32 after every step).
// Without a working copy (fp32) and for zero1-broadcast the master itself is exchanged.
// With defer_gathers (parallel.overlap_param_gather) zero1/zero2 leave that all-gather in flight
// after step(), in segments the next forward waits for one by one (the trainer does). Offloaded
// (gather_per_unit) they leave it to the next forward unit by unit, each unit's gather issued once
// this rank's host update of the unit has landed.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/io/config.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/optim/optimizer.h"
#include "lmscale/parallel/ddp.h"
#include "lmscale/parallel/gradient_sync.h"
#include "lmscale/parallel/offloaded_shards.h"
#include "lmscale/parallel/sharded_optimizer.h"

namespace lmscale::parallel {

enum class ZeroMode { zero1_broadcast, zero1, zero2 };
// The deck's parallel.zero for ZeroOptimizer; throws for none and fsdp, which are not its modes.
ZeroMode zero_mode_of(ZeroLevel level);

// Element counts of `size` near-equal contiguous ranges of n elements (the first n % size ranges
// get one more).
std::vector<std::size_t> even_split(std::int64_t n, int size);

class ZeroOptimizer final : public ShardedOptimizer {
 public:
  struct Group {
    Tensor params, grads;   // flat, same size
    Tensor* lowp = nullptr; // flat working copy, or null
    // Parameters of the group (optim/optimizer.h, offsets in the group): layer-wise optimizers
    // need them; empty = the whole group is one parameter.
    std::vector<optim::ParamSegment> segments;
    int num_params = 0;
    // Ranges (offset, numel; ascending, disjoint) that the forward reads from the master although
    // there is a working copy (ParameterStore::master_read_ranges: the norm weights). When the
    // copy is gathered instead of the master, these ranges are gathered in fp32 beside it.
    std::vector<std::pair<std::int64_t, std::int64_t>> master_reads;
    // A group whose master lives on the host (parallel.offload with a working copy; the store's
    // MasterCopy::read_ranges): params undefined, and the master_reads' fp32 values packed in
    // offset order here ([their total]); gathered in place after each step. The size of the
    // group is then the working copy's.
    Tensor packed_reads = {};
    std::int64_t numel() const { return params.defined() ? params.numel() : lowp->numel(); }
  };

  ZeroOptimizer(ZeroMode mode, comm::Communicator& grads, comm::Communicator& host, const OptimConfig& cfg);
  // Shards a new group; returns its index.
  int add_group(const Group& g, Context& ctx);
  // parallel.offload = optimizer (zero_offload.cpp): groups added after this keep their shard's
  // fp32 master and AdamW state on the host (parallel/offloaded_shards.h, built by `make` for the
  // group's elements [begin, end); add_group fills its master from the group's params, or, for a
  // group without params, `make` has filled it); step() hands the shard's gradients to the host
  // worker and all-gathers the parameters once the worker's copies up have landed (the compute
  // stream waits for them).
  using OffloadFactory = std::function<std::unique_ptr<OffloadedShards>(std::int64_t begin, std::int64_t end)>;
  void offload_optimizer(OffloadFactory make) { offload_ = std::move(make); }
  // The host master of group g's shard [shard_size] (undefined without offload).
  Tensor offloaded_master(int group);
  // Offloaded: waits for the host worker (before the host master or moments are read), after
  // the unit gathers the last step left (finish_unit_gathers: collective when there are any).
  void settle();
  // Offloaded: the device master was written (set_master_parameters): the host master of the
  // shard takes its values and the device copies are rebuilt from it. A group without params:
  // `whole` (fp32 [numel], host) gives the values instead (the caller wrote the working copy).
  void master_changed(Context& ctx, const float* whole = nullptr);
  // Offloaded: a checkpoint load wrote the host master; the device copies are rebuilt from it
  // (a group without params: now, and its working copy and packed reads all-gathered; collective).
  void offloaded_master_loaded(Context& ctx);
  // Offloaded group g without params: every rank's host master all-gathered into `whole` (host,
  // fp32 [numel]); collective.
  void gather_offloaded_master(int group, float* whole);
  // Offloaded, zero1/zero2, one group (docs/parallel.md "CPU offload"): step() hands the shard to
  // the host worker and returns; the all-gather of what the forward reads (the working copy and
  // the packed fp32 norm weights, or the fp32 master) is left to the next forward, unit by unit.
  // units: each forward unit's range of the group (offset, count; store_units over the whole
  // store: units in forward order, 0 the embedding ... L+1 the head).
  void gather_per_unit(std::vector<OffloadedShards::Range> units);
  bool gathers_per_unit() const { return !unit_gathers_.empty(); }
  // Makes ctx's stream wait for unit u's gathers of the last step. First issues, in unit order,
  // the gathers of every unit <= u + kGatherAhead not issued yet, each once this rank's host
  // update of the unit has landed (the host waits for the worker to queue its copies up, ctx's
  // stream for the copies): the gather of unit u + 1 runs during unit u's forward. The units and
  // kGatherAhead are the same on every rank, so every rank issues the same collectives in the same
  // order whatever its worker's speed. Collective; a no-op when the last step left nothing.
  void wait_unit_gathered(Context& ctx, int u);
  static constexpr int kGatherAhead = 1;
  // Every unit gather the last step left, issued and waited (collective; no-op when none).
  void finish_unit_gathers(Context& ctx);
  // Group g's host shard (null without offload): tests hold its worker (set_before_unit).
  OffloadedShards* offloaded_shards(int group) { return shards_[static_cast<std::size_t>(group)].offloaded.get(); }

  // Gradient synchronisation for the trainer (the DDP all-reduce for zero1-broadcast; nothing
  // during the backward for zero1; bucketed reduce-scatter for zero2). `ddp` is the all-reduce
  // variant zero1-broadcast uses; the model's store gives the buckets for zero2.
  GradientSync& sync() override { return *sync_; }
  // zero2 with a store that has no flat gradient buffer: the sync becomes the store's gradient
  // provider (per-bucket buffers allocated during the backward, freed after their reduce-scatter).
  // reduce_dtype (parallel.grad_reduce_dtype): bf16 reduce-scatters each zero2 bucket as a bf16
  // copy, widened into the fp32 gradient shard after the wait. copy_engine
  // (parallel.grad_exchange, zero2 over CUDA on one node): each bucket's ranges go to their owners
  // by peer copies during the backward and are summed after it, once device signals say they
  // landed (comm/peer_copy.h), instead of NCCL's reduce-scatter kernels; collective (the ranks
  // exchange IPC handles).
  void make_sync(DdpMode ddp, model::ParameterStore& store, double bucket_mb, Context& ctx,
                 std::optional<DType> reduce_dtype = std::nullopt, bool copy_engine = false);

  // Sum of squares of the summed gradient over all groups (after sync().finish()), reduced over
  // ranks where each holds only its range.
  double grad_sum_squares(Context& ctx) override;
  double grad_sum_squares_in(Context& ctx, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) override;
  // One step of every group's range, then the parameters are made whole again on every rank.
  void step(Context& ctx, double lr, double grad_scale) override;
  // parallel.overlap_param_gather (zero1/zero2, one group): step() leaves the all-gather of what
  // the forward reads (the working copy, else the fp32 master) in flight, one asynchronous
  // collective per range (offset, numel) of group 0, in the order given (the next forward's).
  // take_gathers() hands out their Works, in that order: the caller waits on each before the
  // forward reads the range. The norm weights' master ranges are still gathered inside step().
  void defer_gathers(std::vector<std::pair<std::int64_t, std::int64_t>> ranges);
  std::vector<comm::Work> take_gathers() { return std::exchange(in_flight_gathers_, {}); }
  void complete_master(Context& ctx) override;

  std::size_t state_bytes() const override;  // this rank's AdamW state
  std::int64_t shard_begin(int group) const;  // first element this rank owns in a group
  std::int64_t shard_size(int group) const;
  // zero1/zero2: this rank's reduced gradients of a group's range [shard_size] (after finish()).
  const Tensor& grad_shard(int group) const { return shards_[static_cast<std::size_t>(group)].grad_shard; }
  std::int64_t steps() const override;
  optim::Optimizer& group_optimizer(int group) { return optimizer_of(shards_[static_cast<std::size_t>(group)]); }

 private:
  struct Shard {
    Group g;
    std::vector<std::size_t> counts;   // per rank
    std::int64_t begin = 0, size = 0;   // this rank's range
    Tensor grad_shard;                   // zero1/zero2: reduced gradients of the range
    std::unique_ptr<optim::Optimizer> opt;   // optim.name over this rank's range (on the device)
    std::unique_ptr<OffloadedShards> offloaded;   // or: parallel.offload (master, m, v on the host)
    bool master_partial = false;   // only [begin, begin + size) of g.params (and master_reads) is current here
    std::vector<std::size_t> read_counts;   // per rank: elements of g.master_reads inside its range
  };
  static optim::Optimizer& optimizer_of(const Shard& s) {
    return s.offloaded ? static_cast<optim::Optimizer&>(s.offloaded->optimizer()) : *s.opt;
  }
  void distribute_parameters(Shard& s, Context& ctx);
  bool gathers_working_copy(const Shard& s) const;
  void gather_master_reads(Shard& s, Context& ctx);
  void gather_packed_reads(Shard& s);
  const Tensor& shard_grads(Shard& s);

  ZeroMode mode_;
  comm::Communicator& grads_;
  comm::Communicator& host_;
  OptimConfig cfg_;
  OffloadFactory offload_;   // set: the shards' master and optimizer live on the host
  std::vector<Shard> shards_;
  std::unique_ptr<GradientSync> sync_;
  std::vector<std::pair<std::int64_t, std::int64_t>> deferred_ranges_;   // empty: gather inside step()
  std::vector<comm::Work> in_flight_gathers_;
  // gather_per_unit: per forward unit, its range of group 0 and of its packed master reads, with
  // each rank's elements of them (zero_offload.cpp).
  struct UnitGather {
    std::int64_t offset = 0, count = 0;
    std::vector<std::size_t> counts;
    std::int64_t reads_offset = 0, reads_count = 0;
    std::vector<std::size_t> read_counts;
  };
  std::vector<UnitGather> unit_gathers_;
  std::vector<std::vector<comm::Work>> unit_works_;   // per unit: its gathers in flight
  int units_issued_ = 0, units_waited_ = 0;           // of the last step's unit gathers
  bool units_pending_ = false;                        // the last step left unit gathers
  Context* units_ctx_ = nullptr;                      // the step's context (settle() has none)
  void issue_unit_gather(Context& ctx, int u);
  friend class ReduceScatterSync;
};

}  // namespace lmscale::parallel
