// ZeroOptimizer under parallel.offload = optimizer (parallel/zero.h, docs/parallel.md "CPU
// offload"): each shard's fp32 master and AdamW state live in an OffloadedShards on the host. A
// group with params keeps the device master beside it (stale but for the norm weights); a group
// without (the store's MasterCopy::read_ranges) has only the working copy and the packed fp32
// master reads on the device, and its master is the ranks' host masters together.
#include <cstring>

#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/zero.h"

#include "gather_in_place.h"

namespace lmscale::parallel {

Tensor ZeroOptimizer::offloaded_master(int group) {
  Shard& s = shards_[static_cast<std::size_t>(group)];
  return s.offloaded ? s.offloaded->master() : Tensor();
}

void ZeroOptimizer::settle() {
  for (auto& s : shards_)
    if (s.offloaded) s.offloaded->settle();
}

void ZeroOptimizer::master_changed(Context& ctx, const float* whole) {
  for (auto& s : shards_) {
    if (!s.offloaded) continue;
    s.offloaded->settle();
    if (s.g.params.defined()) {
      ops::copy(ctx, s.g.params.flat_range(s.begin, s.size), s.offloaded->master());   // D2H to pageable memory: synchronous
    } else {
      LMSCALE_CHECK(whole != nullptr, "master_changed: a group without params takes the values from the caller");
      std::memcpy(s.offloaded->master().data(), whole + s.begin, static_cast<std::size_t>(s.size) * sizeof(float));
    }
    s.offloaded->mark_master_changed();
    s.master_partial = false;   // the whole device master was written
  }
}

void ZeroOptimizer::offloaded_master_loaded(Context& ctx) {
  for (auto& s : shards_) {
    if (!s.offloaded) continue;
    s.offloaded->mark_master_changed();
    if (s.g.params.defined()) continue;   // rebuilt at the next use; the device master was loaded whole
    // Only this rank's range of the working copy and packed reads can be rebuilt here (from its
    // host master); the other ranks' come with the gather, as after a step.
    for (int u = 0; u < s.offloaded->units(); ++u) s.offloaded->wait_unit(ctx, u);
    distribute_parameters(s, ctx);
  }
}

void ZeroOptimizer::gather_offloaded_master(int group, float* whole) {
  Shard& s = shards_[static_cast<std::size_t>(group)];
  LMSCALE_CHECK(s.offloaded && !s.g.params.defined(), "gather_offloaded_master: group {} keeps its master on the device",
                group);
  s.offloaded->settle();
  std::memcpy(whole + s.begin, s.offloaded->master().data(), static_cast<std::size_t>(s.size) * sizeof(float));
  gather_in_place(host_, Tensor::view(whole, {s.g.numel()}, DType::f32, Device::cpu), s.counts);
}

// The packed fp32 master reads of a group without params: each rank's elements of them form one
// contiguous slice of the packed buffer (ranges in offset order, ranks' ranges consecutive), which
// its host worker wrote: gathered in place.
void ZeroOptimizer::gather_packed_reads(Shard& s) { gather_in_place(grads_, s.g.packed_reads, s.read_counts); }

}  // namespace lmscale::parallel
