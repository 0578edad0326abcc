#pragma once
// The parallel layout of a run, resolved once from the deck and the world size: the degrees of
// the dp x tp x pp mesh and the data-parallel choices that the trainer and the predictors (the
// accounting, the memory model and its replay) must agree on. Rules such as "one process and
// ZeRO-2 keep their gradients in lazy buckets" live here and nowhere else
// (docs/architecture.md §4).
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

struct Spec {
  int dp = 1, tp = 1, pp = 1;
  ZeroLevel zero = ZeroLevel::none;
  DdpKind ddp = DdpKind::none;
  double bucket_mb = 25;   // parallel.bucket_mb

  // From the deck's [parallel] section; dp = 0 resolves to world / (tp * pp).
  static Spec resolve(const ParallelConfig& pc, int world);

  comm::MeshShape mesh_shape() const;
  // ZeRO and FSDP act only with more than one data-parallel rank: with one, every parallel.zero
  // value is the plain one-process path.
  bool sharded_optimizer() const { return dp > 1 && zero != ZeroLevel::none; }
  bool fsdp() const { return dp > 1 && zero == ZeroLevel::fsdp; }
  GradStorage grad_storage() const;
  // Bytes of one lazy gradient bucket: large for one data-parallel rank (the optimizer makes few
  // launches: ~32 for xl), parallel.bucket_mb under zero2 (the reduce-scatter's granularity).
  double lazy_bucket_bytes() const;
};

// The lazy bucket size of one process (Spec::lazy_bucket_bytes with dp = 1).
inline constexpr double kOneProcessBucketBytes = 256.0 * 1024 * 1024;

}  // namespace lmscale::parallel
