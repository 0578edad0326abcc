// ZeroOptimizer under parallel.offload = optimizer (parallel/zero.h, docs/parallel.md "CPU
// offload"): each shard's fp32 master and AdamW state live in an OffloadedShards on the host. A
// group with params keeps the device master beside it (stale but for the norm weights); a group
// without (the store's MasterCopy::read_ranges) has only the working copy and the packed fp32
// master reads on the device, and its master is the ranks' host masters together.
#include <algorithm>
#include <cstring>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/zero.h"

#include "gather_in_place.h"

namespace lmscale::parallel {

Tensor ZeroOptimizer::offloaded_master(int group) {
  Shard& s = shards_[static_cast<std::size_t>(group)];
  return s.offloaded ? s.offloaded->master() : Tensor();
}

void ZeroOptimizer::settle() {
  if (units_pending_) finish_unit_gathers(*units_ctx_);
  for (auto& s : shards_)
    if (s.offloaded) s.offloaded->settle();
}

void ZeroOptimizer::master_changed(Context& ctx, const float* whole) {
  finish_unit_gathers(ctx);
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
  finish_unit_gathers(ctx);
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
  if (units_pending_) finish_unit_gathers(*units_ctx_);   // (the host comm's collective after the device's)
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

// Per unit u: its range [offset, offset + count) of the group, each rank's elements of it (ranks
// hold consecutive ranges, so their parts of the unit are consecutive: gathered in place like the
// whole buffer), and, for a group without params, the unit's slice of the packed master reads
// (ranges in offset order: a unit's norm weights are consecutive there, and so are each rank's).
void ZeroOptimizer::gather_per_unit(std::vector<OffloadedShards::Range> units) {
  LMSCALE_CHECK(mode_ != ZeroMode::zero1_broadcast, "per-unit gathers: zero1 and zero2 only");
  LMSCALE_CHECK(shards_.size() == 1 && shards_[0].offloaded, "per-unit gathers: one offloaded group ({} groups here)",
                shards_.size());
  LMSCALE_CHECK(deferred_ranges_.empty(), "per-unit gathers exclude the deferred gathers (overlap_param_gather)");
  const Shard& s = shards_[0];
  LMSCALE_CHECK(!(s.g.lowp && s.g.params.defined()),
                "per-unit gathers: the fp32 master, or a working copy without the device master (not both)");
  const std::size_t ranks = s.counts.size();
  auto rank_lo = [&](std::size_t q) {
    std::int64_t lo = 0;
    for (std::size_t r = 0; r < q; ++r) lo += static_cast<std::int64_t>(s.counts[r]);
    return lo;
  };
  auto overlap = [](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
    return std::max<std::int64_t>(0, std::min(b, d) - std::max(a, c));
  };
  unit_gathers_.clear();
  std::int64_t covered = 0;
  for (const OffloadedShards::Range& u : units) {
    LMSCALE_CHECK(u.offset >= 0 && u.count >= 0 && u.offset + u.count <= s.g.numel(), "per-unit gathers: unit {}+{}",
                  u.offset, u.count);
    covered += u.count;
    UnitGather g;
    g.offset = u.offset;
    g.count = u.count;
    g.read_counts.assign(ranks, 0);
    bool first_read = true;
    std::int64_t packed_at = 0;   // offset of the current master read in the packed buffer
    for (const auto& [offset, numel] : s.g.master_reads) {
      // The range's piece inside the unit (a range of adjacent norm weights may span two units).
      const std::int64_t a = std::max(offset, u.offset), b = std::min(offset + numel, u.offset + u.count);
      if (a < b) {
        if (first_read) g.reads_offset = packed_at + (a - offset);
        first_read = false;
        g.reads_count += b - a;
        for (std::size_t q = 0; q < ranks; ++q)
          g.read_counts[q] += static_cast<std::size_t>(
              overlap(a, b, rank_lo(q), rank_lo(q) + static_cast<std::int64_t>(s.counts[q])));
      }
      packed_at += numel;
    }
    if (s.g.params.defined()) {   // the fp32 master itself is gathered, the reads with it
      g.reads_count = 0;
      g.read_counts.assign(ranks, 0);
    }
    for (std::size_t q = 0; q < ranks; ++q)
      g.counts.push_back(static_cast<std::size_t>(
          overlap(u.offset, u.offset + u.count, rank_lo(q), rank_lo(q) + static_cast<std::int64_t>(s.counts[q]))));
    unit_gathers_.push_back(std::move(g));
  }
  LMSCALE_CHECK(covered == s.g.numel(), "per-unit gathers: the units cover {} of {} elements", covered, s.g.numel());
  LMSCALE_CHECK(static_cast<int>(units.size()) == s.offloaded->units(),
                "per-unit gathers: {} units for a host shard of {}", units.size(), s.offloaded->units());
  unit_works_.assign(unit_gathers_.size(), {});
}

// Unit u of the step in flight: this rank's part of it is on the device once ctx's stream has
// waited for the worker's copies up; then the unit's range of what the forward reads, and of the
// packed norm weights, are all-gathered in place, left in flight.
void ZeroOptimizer::issue_unit_gather(Context& ctx, int u) {
  NvtxRange r("zero_unit_gather");
  Shard& s = shards_[0];
  s.offloaded->wait_unit(ctx, u);
  const UnitGather& g = unit_gathers_[static_cast<std::size_t>(u)];
  std::vector<comm::Work>& works = unit_works_[static_cast<std::size_t>(u)];
  const Tensor& buf = s.g.lowp ? *s.g.lowp : s.g.params;
  if (g.count > 0) works.push_back(gather_in_place(grads_, buf.flat_range(g.offset, g.count), g.counts, true));
  if (g.reads_count > 0)
    works.push_back(gather_in_place(grads_, s.g.packed_reads.flat_range(g.reads_offset, g.reads_count), g.read_counts, true));
}

void ZeroOptimizer::wait_unit_gathered(Context& ctx, int u) {
  if (!units_pending_) return;
  const int units = static_cast<int>(unit_gathers_.size());
  LMSCALE_CHECK(u >= 0 && u < units, "unit {} of {}", u, units);
  for (const int last = std::min(units - 1, u + kGatherAhead); units_issued_ <= last; ++units_issued_)
    issue_unit_gather(ctx, units_issued_);
  for (; units_waited_ <= u; ++units_waited_)
    for (comm::Work& w : std::exchange(unit_works_[static_cast<std::size_t>(units_waited_)], {})) w.wait();
  if (units_waited_ == units) units_pending_ = false;
}

void ZeroOptimizer::finish_unit_gathers(Context& ctx) {
  if (units_pending_) wait_unit_gathered(ctx, static_cast<int>(unit_gathers_.size()) - 1);
}

}  // namespace lmscale::parallel
