#pragma once
// The parallel layout of a run, resolved once from the deck and the world size: the degrees of
// the dp x tp x pp mesh and the data-parallel choices that the trainer and the predictors (the
// accounting, the memory model and its replay) must agree on. Rules such as "one process and
// ZeRO-2 keep their gradients in lazy buckets" live here and nowhere else
// (docs/architecture.md §4).
#include <string>

#include "lmscale/comm/mesh.h"
#include "lmscale/io/config.h"

namespace lmscale::parallel {

// Where a rank's gradients live between the backward and the optimizer step.
enum class GradStorage {
  // Per-bucket buffers, allocated as the backward frees activations and freed after the step, so
  // they never coexist with the whole forward's activations (one process; zero2, whose buckets
  // are reduce-scattered as they fill).
  lazy_buckets,
  // One flat fp32 buffer over every parameter, alive for the whole step (DDP, zero1,
  // zero1-broadcast: reduced in place).
  flat,
  // Only the shards the strategy owns; the store holds no flat buffers (fsdp).
  shards,
};

// How a strategy makes the bf16 copies of parallel.grad_reduce_dtype = bf16 (none: fp32, or a
// strategy that does not stage): ddp flat one copy of the flat buffer, ddp overlap one per
// parameter, bucketed DDP and zero2 one per bucket.
enum class ReduceStaging { none, flat, per_param, buckets };

// parallel.grad_exchange = copy-engine: the receive window a strategy allocates at init
// (comm/peer_copy.h). zero2: one shard-sized slot per other rank; bucketed DDP: per other rank,
// this rank's part of every bucket (parallel/copy_engine_all_reduce.h).
enum class CopyEngineWindow { none, shard_slots, bucket_parts };

// When a strategy's gradient collectives run relative to the backward (the planner's overlap rule,
// docs/planner.md): none (one data-parallel rank); after the backward, on the critical path (DDP
// naive and flat, zero1, zero1-broadcast); during the backward of the last micro-batch, bucket by
// bucket as gradients become final (DDP overlap and bucketed, zero2); per unit (fsdp: each unit's
// reduce-scatter beside the next unit's backward, its all-gathers beside the previous unit's
// compute, in every micro-batch).
enum class GradientTiming { none, after_backward, during_backward, per_unit };

struct Spec {
  int dp = 1, tp = 1, pp = 1;
  // parallel.ep: the experts of MoE blocks split over ep consecutive ranks of each dp group
  // (docs/parallel.md, "Expert parallelism"). The data-parallel strategy (DDP, ZeRO) then runs over
  // the expert_dp group of dp / ep ranks (gradient_group()); the dense gradients are first summed
  // over the ep group (parallel/expert_parallel_strategy.h).
  int ep = 1;
  // parallel.ep_exchange: the backend of the ep group's row all-to-alls (parallel/expert_parallel.h).
  EpExchange ep_exchange = EpExchange::nccl;
  ZeroLevel zero = ZeroLevel::none;
  DdpKind ddp = DdpKind::none;
  double bucket_mb = 25;   // parallel.bucket_mb
  GradExchange grad_exchange = GradExchange::nccl;
  GradReduceDtype grad_reduce_dtype = GradReduceDtype::fp32;
  bool sequence_parallel = false;
  OffloadMode offload = OffloadMode::none;   // parallel.offload (docs/parallel.md)
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;

  // From the deck's [parallel] section; dp = 0 resolves to world / (tp * pp).
  static Spec resolve(const ParallelConfig& pc, int world);

  comm::MeshShape mesh_shape() const;
  // The ranks the data-parallel strategy reduces and shards over: dp, or dp / ep with expert
  // parallelism (the expert_dp group). Every rule below is about that group.
  int gradient_group() const { return dp / ep; }
  // ZeRO and FSDP act only with more than one rank in that group: with one, every parallel.zero
  // value is the plain one-process path.
  bool sharded_optimizer() const { return gradient_group() > 1 && zero != ZeroLevel::none; }
  bool fsdp() const { return gradient_group() > 1 && zero == ZeroLevel::fsdp; }
  GradStorage grad_storage() const;
  // Whether the parameter store holds the fp32 master of every parameter. Not under
  // parallel.offload for one process, zero1 and zero2: the master of what a rank owns is the host
  // optimizer's, and the store keeps fp32 only for the ranges the forward reads in fp32 (the norm
  // weights) when a working copy exists (model::ParameterStore::MasterCopy::read_ranges); the
  // other ranks' ranges come with the gathered working copy. (fsdp's store holds no buffers.)
  bool master_in_store() const { return offload == OffloadMode::none || fsdp(); }
  // Bytes of one lazy gradient bucket: large for one data-parallel rank (the optimizer makes few
  // launches: ~32 for xl), parallel.bucket_mb under zero2 (the reduce-scatter's granularity).
  double lazy_bucket_bytes() const;
  // zero1 and zero2 receive their range's summed gradients into a shard (4 B per owned element);
  // zero1-broadcast all-reduces the whole buffer instead, fsdp keeps per-unit shards.
  bool gradient_shard() const;
  // zero1-broadcast: after its step each rank broadcasts its range (the seed's ZeRO-1).
  bool broadcast_update() const { return gradient_group() > 1 && zero == ZeroLevel::zero1_broadcast; }
  // zero2: each gradient bucket is reduce-scattered as soon as the backward fills it.
  bool bucket_reduce_scatter() const { return gradient_group() > 1 && zero == ZeroLevel::zero2; }
  ReduceStaging reduce_staging() const;
  // Predictor hooks of the step-time model (jobs/plan/step_model.h): when the gradient collectives
  // run, which collective reduces the gradients (all-reduce, or reduce-scatter into the owners'
  // shards), and whether the updated 16-bit working copy is all-gathered after the step (zero1,
  // zero2; zero1-broadcast broadcasts each owner's range instead).
  GradientTiming gradient_timing() const;
  CollectiveOp gradient_collective() const;
  bool gathers_parameters_after_step() const { return gradient_shard(); }
  // A stage's idle time per step under this layout's schedule (0 without stages), for M
  // microbatches whose forward, B (input gradients) and W (weight gradients) passes take f, b, w
  // on the stage, in the units of f, b, w: pipeline_idle below.
  double bubble_idle(int microbatches, int virtual_stages, double f, double b, double w) const;
  CopyEngineWindow copy_engine_window() const;
  // parallel.ep_exchange = copy-engine with ep > 1: the ep group's all-to-alls keep a receive
  // window from initialisation on (parallel/copy_engine_all_to_all.h), whatever the strategy.
  bool ep_exchange_window() const { return ep > 1 && ep_exchange == EpExchange::copy_engine; }
  // The data-parallel choice as printed: "zero2", "fsdp", "ddp bucketed", "ddp flat".
  std::string data_parallel_name() const;
  // The spec of the data-parallel strategy under expert parallelism: dp = gradient_group(), ep 1.
  Spec gradient_group_spec() const;
  // The whole layout for a world of that many ranks: "one process", "ddp bucketed (4 ranks)",
  // "zero2 x tp 2 (4 ranks)", "ddp flat x pp 2 (1f1b) (2 ranks)".
  std::string describe(int world) const;
};

// The lazy bucket size of one process (Spec::lazy_bucket_bytes with dp = 1).
inline constexpr double kOneProcessBucketBytes = 256.0 * 1024 * 1024;

// The idle time of each stage of a pipeline of `stages` over one step of M microbatches, whose
// forward, B and W passes take f, b, w on every stage (no transfer time; docs/parallel.md derives
// each): GPipe and 1F1B (p - 1)(f + b + w), the fill and drain; interleaved over v chunks per rank
// (p - 1)(f + b + w) / v; ZB-H1 (p - 1)(f + b) - (min(M, p) - 1) w, the drain's hops costing B only
// while a deferred W is in hand (1F1B's with w = 0).
double pipeline_idle(PipelineSchedule schedule, int stages, int microbatches, int virtual_stages, double f, double b,
                     double w);

}  // namespace lmscale::parallel
