#pragma once
// The one gradient bucket reducer of the data-parallel strategies (docs/architecture.md §4):
// DDP overlap/bucketed and ZeRO-2 configure it with a backend and do no counting of their own.
//
// The buckets (parallel/grad_buckets.h) are contiguous ranges of parameters. During the last
// micro-batch's backward of a step the model calls on_grad_ready(i) once per parameter, in the
// order the backward finishes them; the reducer counts the gradients each bucket still waits
// for and, at the moment a bucket's last gradient is ready, calls backend.launch(b) -- from
// inside that hook, so a bucket's reduction is queued right behind the backward's last write
// into it and overlaps the rest of the backward. The hook is O(1): two array lookups, a
// decrement and, once per bucket, one virtual call.
//
// Arming: the counters are reset, and backend.begin_step() called, when the hooks of a step's
// last micro-batch are handed out (earlier micro-batches only accumulate gradients). A
// pipeline hands out each micro-batch's hooks once and shares them between its chunks
// (parallel/pipeline.cpp, hooks_for): asking again would re-arm halfway through the backward.
//
// finish(), after the backward: every bucket must have launched (else one clear error naming
// the bucket -- checked before the backend waits, which would otherwise block on collectives or
// copy-engine signals that never come, here and on the other ranks); then backend.complete().
#include <vector>

#include "lmscale/model/parallel_context.h"
#include "lmscale/parallel/grad_buckets.h"

namespace lmscale::parallel {

// How a strategy reduces a complete bucket: an all-reduce (parallel/ddp.cpp), a reduce-scatter
// (parallel/zero.cpp) or the copy engines (parallel/copy_engine_all_reduce.h, and zero2's
// peer-copy exchange).
class BucketBackend {
 public:
  virtual ~BucketBackend() = default;
  // A new step: the last micro-batch's backward is about to run (nothing of it launched yet).
  virtual void begin_step() {}
  // Bucket b's last gradient is final (its writes are queued on the compute stream).
  virtual void launch(int bucket) = 0;
  // After the backward, every bucket launched: the reductions are in place (for the compute
  // stream) when this returns.
  virtual void complete() {}
};

class BucketReducer {
 public:
  // buckets over a store of num_params parameters (each parameter in exactly one bucket);
  // backend: launches the complete buckets (set_backend replaces it, between steps).
  BucketReducer(std::vector<GradBucket> buckets, int num_params, BucketBackend& backend);
  void set_backend(BucketBackend& backend) { backend_ = &backend; }

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Hooks for the backward of micro-batch `micro` of `micro_count`: the last one arms the
  // counters and gets the on_grad_ready hook; the others, and a reducer without buckets, get none.
  model::ParallelContext hooks(int micro, int micro_count);
  // Whether a step's hooks were handed out and finish() has not run since.
  bool armed() const { return armed_; }
  // After the backward: checks that every bucket launched, disarms, then backend.complete().
  void finish();

 private:
  void ready(int param) {
    const auto b = static_cast<std::size_t>(bucket_of_[static_cast<std::size_t>(param)]);
    if (--pending_[b] == 0) backend_->launch(static_cast<int>(b));
  }

  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_;   // parameter -> bucket
  std::vector<int> pending_;     // bucket -> gradients not yet ready this step
  BucketBackend* backend_;
  bool armed_ = false;
};

}  // namespace lmscale::parallel
