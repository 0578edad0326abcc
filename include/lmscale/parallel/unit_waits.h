#pragma once
// Work a strategy leaves in flight after its optimizer step, for the next forward to wait on unit
// by unit (docs/architecture.md §4, "overlapped update"): the segments of an update on the
// runtime's side stream (parallel.overlap_optimizer) or the segments of ZeRO's parameter
// all-gather (parallel.overlap_param_gather), or the copy up of an offloaded update
// (parallel.offload, parallel/offloaded_shards.h), or under ZeRO its per-unit parameter gather
// (ZeroOptimizer::gather_per_unit). The next forward's before_forward(u) makes the
// compute stream wait for every segment holding parameters of units <= u, so the first blocks
// compute while the last ones are still updated or gathered.
//
// Units: 0 the embedding, l+1 block l, L+1 the final norm and the head.
#include <cstddef>
#include <functional>
#include <vector>

#include "lmscale/comm/work.h"
#include "lmscale/model/parallel_context.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/parallel/grad_buckets.h"

namespace lmscale::parallel {

// A range of the store's flat buffer with the first unit that reads it.
struct UnitSegment {
  GradBucket range;
  int first_unit = 0;
};
// The unit of each bucket's lowest parameter (layers: the model's block count).
std::vector<UnitSegment> unit_segments(const std::vector<model::ParamInfo>& infos, int layers,
                                       const std::vector<GradBucket>& buckets);

class UnitWaits {
 public:
  struct Pending {
    int bucket = -1;            // a lazy gradient bucket to free after the wait, or -1
    int first_unit = 0;         // the lowest unit with a parameter in the segment
    ops::Runtime::Mark done;    // on the side stream, after the segment's update
    comm::Work gathered;        // or: the segment's parameter all-gather
    std::function<void()> wait; // or: this (the offloaded update's copy up of a unit; a no-op
                                // for an item that only frees its bucket)
  };
  static constexpr int kAllUnits = 1 << 30;

  // released(bucket) runs after the wait for each pending item with a bucket >= 0 (ordered after
  // the wait on the compute stream, so the allocator may hand its bytes to the forward).
  UnitWaits(ops::Runtime& rt, std::function<void(int bucket)> released) : rt_(rt), released_(std::move(released)) {}

  // Items must come in ascending first_unit (forward order).
  void push(Pending p) { pending_.push_back(std::move(p)); }
  bool empty() const { return pending_.empty(); }
  // The compute stream waits for every item of units <= unit (kAllUnits: all of them).
  void wait_until(int unit);
  // pc with the waits in front of its before_forward (pc unchanged when nothing is pending).
  model::ParallelContext in_front_of(model::ParallelContext pc);

 private:
  ops::Runtime& rt_;
  std::function<void(int)> released_;
  std::vector<Pending> pending_;
  std::size_t next_ = 0;
};

}  // namespace lmscale::parallel
