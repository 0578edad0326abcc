#include "lmscale/parallel/zero_strategy.h"

#include <algorithm>
#include <array>

#include "lmscale/core/error.h"
#include "lmscale/optim/host_adamw.h"
#include "lmscale/parallel/store_offload.h"
#include "lmscale/parallel/optimizer_segments.h"
#include "lmscale/parallel/tensor_parallel.h"

namespace lmscale::parallel {

ZeroStrategy::ZeroStrategy(const StrategyParts& parts) : Strategy(parts), rt_(parts.rt), waits_(parts.rt, {}) {
  Context& ctx = parts.rt.ctx();
  const ParallelConfig& pc = parts.cfg.parallel;
  LMSCALE_CHECK(parts.dp && parts.dp_host, "data parallelism needs the world communicators");
  if (parts.dp->device() == Device::cuda) parts.dp->set_compute_stream(ctx.stream);
  zero_ = std::make_unique<ZeroOptimizer>(zero_mode_of(pc.zero), *parts.dp, *parts.dp_host, parts.cfg.optim);
  // parallel.offload = optimizer: each rank's shard of the master and its state on the host
  // (parallel/offloaded_shards.h), copied up into the store's weights (parallel/store_offload.h);
  // the host threads are split over the dp ranks, assumed to share one host (docs/parallel.md).
  if (spec_.offload == OffloadMode::optimizer) {
    const int threads = optim::host_adamw_threads(spec_.dp, pc.offload_threads), layers = parts.layers;
    ops::Runtime& rt = parts.rt;
    const OptimConfig& optim_cfg = parts.cfg.optim;
    zero_->offload_optimizer([this, &rt, &optim_cfg, threads, layers](std::int64_t begin, std::int64_t end) {
      auto off = std::make_unique<OffloadedShards>(rt, end - begin, store_units(store_, layers, begin, end),
                                                   store_targets(store_, begin, end), store_.lowp_dtype(), optim_cfg,
                                                   threads);
      // A store without the whole master (Spec::master_in_store): the host master's initial
      // values are computed here, as the store computed its own (add_group copies them otherwise).
      if (!store_.has_whole_master()) store_.initial_master(begin, end, off->master(), rt.ctx());
      return off;
    });
  }
  // Without the whole master in the store (offload with a working copy) the group has no params:
  // the working copy and the packed fp32 master reads are what the device holds.
  const bool whole = store_.has_whole_master();
  zero_->add_group({whole ? store_.flat_params() : Tensor(), store_.has_flat_grads() ? store_.flat_grads() : Tensor(),
                    store_.has_lowp() ? &store_.flat_lowp() : nullptr, param_segments(store_.infos(), 0, store_.numel()),
                    store_.size(), store_.master_read_ranges(), whole ? Tensor() : store_.packed_master_reads()},
                   ctx);
  // Offloaded: the parameter all-gather goes unit by unit in the next forward, each unit's once
  // its host update has landed (ZeroOptimizer::gather_per_unit), so the forward of the first
  // units overlaps the host update of the later ones.
  if (spec_.offload == OffloadMode::optimizer) {
    zero_->gather_per_unit(store_units(store_, parts.layers, 0, store_.numel()));
    gather_units_ = parts.layers + 2;
  }
  // parallel.grad_reduce_dtype (fp64 test runs keep their own dtype).
  const std::optional<DType> grad_reduce =
      pc.grad_reduce_dtype == GradReduceDtype::bf16 ? std::optional<DType>(DType::bf16) : std::nullopt;
  zero_->make_sync(ddp_mode_of(pc.ddp), store_, pc.bucket_mb, ctx, grad_reduce,
                   pc.grad_exchange == GradExchange::copy_engine);
  if (tp_) {
    // ZeRO over the dp axis of a dp x tp mesh: the shards' norm sums are summed over dp by the
    // optimizer, then over the tp slices here.
    zero_->set_norm_reducer([this](std::vector<double>& sums) {
      tp_->sum_param_norms(store_.infos(), optim::Optimizer::kNormSlots, sums);
    });
  }
  // parallel.overlap_param_gather: the zero1/zero2 parameter all-gather in segments of
  // parallel.bucket_mb (of fp32 master bytes), in forward order (ascending first unit; the flat
  // buffer holds the units in backward order).
  if (pc.overlap_param_gather && pc.zero != ZeroLevel::zero1_broadcast && !tp_ && !parts.pipeline) {
    gather_segments_ =
        unit_segments(store_.infos(), parts.layers, gradient_buckets(store_.infos(), pc.bucket_mb * 1024.0 * 1024.0, 4));
    std::reverse(gather_segments_.begin(), gather_segments_.end());
    std::stable_sort(gather_segments_.begin(), gather_segments_.end(),
                     [](const UnitSegment& a, const UnitSegment& b) { return a.first_unit < b.first_unit; });
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (const auto& g : gather_segments_) ranges.emplace_back(g.range.offset, g.range.numel);
    zero_->defer_gathers(std::move(ranges));
  }
}

ZeroStrategy::~ZeroStrategy() = default;

model::ParallelContext ZeroStrategy::forward_hooks(bool training) {
  return waits_.in_front_of(zero_->sync().forward_hooks(training));
}

double ZeroStrategy::grad_sum_squares(Context& ctx) { return sharded_sum_squares(ctx, *zero_); }

void ZeroStrategy::step(Context& ctx, double lr, double grad_scale) {
  waits_.wait_until(UnitWaits::kAllUnits);   // a step with no forward since the last
  zero_->step(ctx, lr, grad_scale);
  // Offloaded: the next forward's unit u issues the gathers up to unit u + 1 and waits for u's.
  for (int u = 0; u < gather_units_; ++u)
    waits_.push({-1, u, {}, {}, [this, u] { zero_->wait_unit_gathered(rt_.ctx(), u); }});
  if (gather_segments_.empty()) return;
  // The next forward waits for each segment's gather before its first unit.
  std::vector<comm::Work> w = zero_->take_gathers();
  LMSCALE_CHECK(w.size() == gather_segments_.size(), "{} deferred gathers for {} segments", w.size(),
                gather_segments_.size());
  for (std::size_t j = 0; j < w.size(); ++j) waits_.push({-1, gather_segments_[j].first_unit, {}, std::move(w[j]), {}});
}

void ZeroStrategy::settle() {
  waits_.wait_until(UnitWaits::kAllUnits);
  zero_->settle();
}

void ZeroStrategy::set_master_parameters(Context& ctx, const std::vector<float>& values) {
  Strategy::set_master_parameters(ctx, values);   // the store's master (or master reads) and working copy
  zero_->master_changed(ctx, values.data());
}

void ZeroStrategy::set_optimizer_steps(std::int64_t steps) {
  settle();
  // A checkpoint load wrote the host master (state_layout); without the whole master in the
  // store, the working copy and master reads are rebuilt from it now (collective).
  zero_->offloaded_master_loaded(rt_.ctx());
  zero_->group_optimizer(0).set_steps(steps);
}

std::vector<float> ZeroStrategy::master_parameters(Context& ctx) {
  settle();   // the deferred gathers, before the master is completed
  if (!store_.has_whole_master()) {   // the ranks' host masters (offload with a working copy)
    std::vector<float> h(static_cast<std::size_t>(store_.numel()));
    zero_->gather_offloaded_master(0, h.data());
    return h;
  }
  zero_->complete_master(ctx);   // the steps gathered only the working copy
  return Strategy::master_parameters(ctx);
}

StateLayout ZeroStrategy::state_layout() {
  // The master is replicated (every rank loads all of its store), m and v exist for this rank's
  // range of the flat buffer only; the range, cut at parameter boundaries, is what it writes
  // (tp-replicated norms: split once more among the tp ranks, which hold identical copies).
  // Offloaded: this rank's range of the master is the host's (saved from it, loaded into it as
  // well as into the device master, which the other ranges need).
  settle();
  StateLayout out;
  const std::int64_t lo = zero_->shard_begin(0), hi = lo + zero_->shard_size(0);
  optim::Optimizer& opt = zero_->group_optimizer(0);
  const Tensor host_master = zero_->offloaded_master(0);
  auto master = [&](std::int64_t x, std::int64_t n) {
    return host_master.defined() ? host_master.flat_range(x - lo, n) : store_.flat_params().flat_range(x, n);
  };
  // Without the whole master in the store, the other ranges come with the working copy's gather
  // after the load (set_optimizer_steps).
  const bool whole = store_.has_whole_master();
  for (int i = 0; i < store_.size(); ++i) {
    const auto& p = store_.infos()[static_cast<std::size_t>(i)];
    const int g = store_.global_index(i);
    if (whole)
      append_full_pieces(out.load, p, g, 0, p.numel, store_.flat_params().flat_range(p.offset, p.numel), Tensor(),
                         Tensor());
    const std::int64_t a = std::max(lo, p.offset) - p.offset, b = std::min(hi, p.offset + p.numel) - p.offset;
    if (a >= b) continue;
    auto views = [&](std::int64_t x, std::int64_t y) {
      return std::array<Tensor, 3>{master(p.offset + x, y - x),
                                   state_view(opt, 0, p.offset + x - lo, y - x),
                                   state_view(opt, 1, p.offset + x - lo, y - x)};
    };
    auto held = views(a, b);
    append_full_pieces(out.load, p, g, a, b, host_master.defined() ? held[0] : Tensor(), held[1], held[2]);
    std::int64_t sa = a, sb = b;
    if (tp_replicated(p)) {
      const auto [ta, tb] = slice_of(p.numel, tp_->split().rank, tp_->degree());
      sa = std::max(a, ta);
      sb = std::min(b, tb);
    }
    if (sa < sb) {
      auto mine = views(sa, sb);
      append_full_pieces(out.save, p, g, sa, sb, mine[0], mine[1], mine[2]);
    }
  }
  return out;
}

}  // namespace lmscale::parallel
