#include "lmscale/parallel/replicated_strategy.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/optim/host_adamw.h"
#include "lmscale/parallel/store_offload.h"
#include "lmscale/parallel/ddp.h"
#include "lmscale/parallel/optimizer_segments.h"
#include "lmscale/parallel/tensor_parallel.h"

namespace lmscale::parallel {

ReplicatedStrategy::ReplicatedStrategy(const StrategyParts& parts)
    : Strategy(parts), rt_(parts.rt), waits_(parts.rt, [this](int b) { lazy_->release(b); }) {
  Context& ctx = rt_.ctx();
  const ParallelConfig& pc = parts.cfg.parallel;
  if (spec_.dp > 1) {
    LMSCALE_CHECK(parts.dp && parts.dp_host, "data parallelism needs the world communicators");
    if (parts.dp->device() == Device::cuda) parts.dp->set_compute_stream(ctx.stream);
    auto ddp = std::make_unique<DataParallel>(ddp_mode_of(pc.ddp), *parts.dp, *parts.dp_host, store_, pc.bucket_mb);
    if (pc.grad_reduce_dtype == GradReduceDtype::bf16) ddp->set_reduce_dtype(DType::bf16, ctx);
    if (pc.grad_exchange == GradExchange::copy_engine) ddp->use_copy_engine(rt_);
    ddp->broadcast_parameters(ctx);
    sync_ = std::move(ddp);
  } else {
    sync_ = std::make_unique<GradientSync>();
    lazy_ = std::make_unique<LazyGradients>(store_, kOneProcessBucketBytes, *ctx.allocator);
  }
  if (spec_.offload == OffloadMode::optimizer) {
    // One process (the deck refuses DDP with offload): the master, m, v and the update on the
    // host (parallel/offloaded_shards.h); the worker copies each unit's result up into the
    // weights the forward reads (parallel/store_offload.h), which the next forward waits for.
    LMSCALE_CHECK(spec_.dp == 1 && lazy_ && parts.cfg.optim.name == OptimizerName::adamw,
                  "parallel.offload = optimizer: one process with adamw only (deck checks)");
    layers_ = parts.layers;
    offloaded_ = std::make_unique<OffloadedShards>(
        rt_, store_.numel(), store_units(store_, layers_, 0, store_.numel()), store_targets(store_, 0, store_.numel()),
        store_.lowp_dtype(), parts.cfg.optim, optim::host_adamw_threads(1, pc.offload_threads));
    // The initial values: the store's master, or (a store that leaves the master to the host)
    // the same fp32 values computed for the host master.
    if (store_.has_whole_master())
      ops::copy(ctx, store_.flat_params(), offloaded_->master());
    else
      store_.initial_master(0, store_.numel(), offloaded_->master(), ctx);
    offloaded_->mark_targets_current();   // init() wrote the store's weights from the same values
  } else {
    optimizer_ = optim::make_optimizer(parts.cfg.optim, store_.numel(), store_.master_dtype(), ctx, store_.size(),
                                       param_segments(store_.infos(), 0, store_.numel()));
  }
  overlap_ = pc.overlap_optimizer && ctx.device == Device::cuda && !tp_ && !parts.pipeline;
  segments_ = unit_segments(store_.infos(), parts.layers,
                            lazy_ ? lazy_->buckets() : gradient_buckets(store_.infos(), kOneProcessBucketBytes, 4));
}

ReplicatedStrategy::~ReplicatedStrategy() = default;

model::ParallelContext ReplicatedStrategy::forward_hooks(bool training) {
  return waits_.in_front_of(sync_->forward_hooks(training));
}

void ReplicatedStrategy::release_gradients() {
  if (lazy_ && waits_.empty()) lazy_->release();
}

double ReplicatedStrategy::grad_sum_squares(Context& ctx) {
  double sq = 0;
  if (lazy_) {
    std::vector<Tensor> parts;
    for (int b = 0; b < static_cast<int>(lazy_->buckets().size()); ++b) parts.push_back(lazy_->bucket(b));
    sq = optim::sum_of_squares(ctx, parts);
  } else {
    sq = optim::sum_of_squares(ctx, store_.flat_grads());
  }
  if (!tp_) return sq;
  // The sliced parameters' squares add over the tp ranks; the replicated norm weights count once.
  std::vector<Tensor> parts;
  for (int i = 0; i < store_.size(); ++i)
    if (store_.infos()[static_cast<std::size_t>(i)].split_dim < 0) parts.push_back(store_.grad(i));
  return tp_->global_sum_squares(sq, optim::sum_of_squares(ctx, parts));
}

Tensor ReplicatedStrategy::grad_square_parts(Context& ctx) {
  LMSCALE_CHECK(!tp_ && spec_.dp == 1, "grad_square_parts: one process without tensor parallelism only");
  if (!lazy_) return optim::sum_of_squares_parts(ctx, {store_.flat_grads()});
  std::vector<Tensor> parts;
  for (int b = 0; b < static_cast<int>(lazy_->buckets().size()); ++b) parts.push_back(lazy_->bucket(b));
  return optim::sum_of_squares_parts(ctx, parts);
}

optim::Optimizer& ReplicatedStrategy::optimizer() const {
  return offloaded_ ? static_cast<optim::Optimizer&>(offloaded_->optimizer()) : *optimizer_;
}

void ReplicatedStrategy::settle() {
  waits_.wait_until(UnitWaits::kAllUnits);
  if (offloaded_) offloaded_->settle();
}

void ReplicatedStrategy::step_offloaded(Context& ctx, double lr, double grad_scale) {
  // The buckets' gradients as pieces of the store, handed to the host worker; each bucket is
  // freed once the next forward has waited for the unit of its last element (the lane's copies
  // run in order: its gradients went down before that unit's parameters came up).
  const auto& buckets = lazy_->buckets();
  std::vector<ops::GradPiece> pieces;
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b)
    pieces.push_back({buckets[static_cast<std::size_t>(b)].offset, lazy_->bucket(b)});
  std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  offloaded_->start_step(ctx, std::move(pieces), lr, grad_scale);
  const auto& infos = store_.infos();
  for (int u = 0; u <= layers_ + 1; ++u) {
    waits_.push({-1, u, {}, {}, [this, u] { offloaded_->wait_unit(rt_.ctx(), u); }});
    for (int b = 0; b < static_cast<int>(buckets.size()); ++b)
      if (forward_unit(infos[static_cast<std::size_t>(buckets[static_cast<std::size_t>(b)].last)], layers_) == u)
        waits_.push({b, u, {}, {}, [] {}});
  }
}

void ReplicatedStrategy::step(Context& ctx, double lr, double grad_scale) {
  if (offloaded_) return step_offloaded(ctx, lr, grad_scale);
  optim::Optimizer& opt = *optimizer_;
  // The ranges this rank steps: the update segments (the lazy buckets of one process, or the
  // 256 MiB split of DDP's flat buffer when the update is overlapped), else the whole flat
  // buffer (DDP, tensor and pipeline parallelism). Offsets are flat-buffer elements.
  struct Range {
    Tensor params, grads, lowp;
    std::int64_t offset;
    int segment;   // index in segments_, or -1 for the whole buffer
  };
  std::vector<Range> ranges;
  if (lazy_ || overlap_) {
    for (int b = 0; b < static_cast<int>(segments_.size()); ++b) {
      const auto& k = segments_[static_cast<std::size_t>(b)].range;
      Tensor lowp;
      if (store_.has_lowp()) lowp = store_.flat_lowp().flat_range(k.offset, k.numel);
      Tensor g = lazy_ ? lazy_->bucket(b) : store_.flat_grads().flat_range(k.offset, k.numel);
      ranges.push_back({store_.flat_params().flat_range(k.offset, k.numel), g, lowp, k.offset, b});
    }
  } else {
    ranges.push_back({store_.flat_params(), store_.flat_grads(), store_.has_lowp() ? store_.flat_lowp() : Tensor(), 0,
                      -1});
  }
  opt.begin_step();
  if (opt.layerwise()) {
    // Whole parameters on this rank (DDP replicas are identical, pipeline stages disjoint), except
    // tensor-parallel slices: their partial sums are added over the tp group. On the compute
    // stream, before an overlapped update starts.
    std::vector<double> sums(opt.norm_slots(), 0.0);
    for (auto& g : ranges) opt.accumulate_norms(ctx, g.params, g.grads, g.offset, grad_scale, sums);
    if (tp_) tp_->sum_param_norms(store_.infos(), optim::Optimizer::kNormSlots, sums);
    opt.set_norms(sums);
  }
  // Overlapped: on the side stream, after everything the compute stream has queued (the backward,
  // the gradient sync's waits and the norm), segments in forward order (the last holds the
  // embedding), each marked so the next forward waits only for the units it reads.
  Context& octx = overlap_ ? rt_.side_ctx() : ctx;
  if (overlap_) rt_.wait(octx, rt_.mark());
  if (lazy_ && !overlap_) {
    // One process, not overlapped: the buckets' gradients as pieces of the one flat range, so
    // AdamW updates them in one pass (33 launches of xl cost 0.6 ms more than one).
    std::vector<ops::GradPiece> pieces;
    for (const auto& g : ranges) pieces.push_back({g.offset, g.grads});
    std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    Tensor params = store_.flat_params();
    Tensor lowp = store_.has_lowp() ? store_.flat_lowp() : Tensor();
    if (fp8_casts_) fp8_casts_->before_step(octx);
    opt.step_pieces(octx, params, pieces, lowp.defined() ? &lowp : nullptr, 0, lr, grad_scale);
    if (fp8_casts_) fp8_casts_->after_step();
    return;
  }
  if (fp8_casts_) fp8_casts_->before_step(octx);   // (DDP: one range, the whole buffer)
  for (int i = static_cast<int>(ranges.size()) - 1; i >= 0; --i) {
    auto& g = ranges[static_cast<std::size_t>(i)];
    opt.step_range(octx, g.params, g.grads, g.lowp.defined() ? &g.lowp : nullptr, g.offset, lr, grad_scale);
    if (overlap_)
      waits_.push({lazy_ ? g.segment : -1, segments_[static_cast<std::size_t>(g.segment)].first_unit, rt_.mark(octx),
                   {}, {}});
  }
  if (fp8_casts_) fp8_casts_->after_step();
}

void ReplicatedStrategy::set_fp8_weight_casts(model::Fp8WeightCasts* casts) {
  // The step's casts need the whole buffer in one pass: one range (DDP) or one piece list.
  LMSCALE_CHECK(!casts || (optimizer_ && !overlap_ && !tp_),
                "FP8 weight casts in the optimizer step: one process or DDP, not offloaded or overlapped "
                "(parallel::step_casts_fp8_weights)");
  fp8_casts_ = casts;
  if (optimizer_) optimizer_->set_fp8_weight_casts(casts ? &casts->casts() : nullptr);
}

StateLayout ReplicatedStrategy::state_layout() {
  // Every rank holds all of its store; the replicas of each piece (dp ranks; dp x tp ranks for
  // tp-replicated norms) each write a near-equal slice of it.
  // Offloaded: the master is the host's (a load marks it changed: set_optimizer_steps).
  settle();
  StateLayout out;
  optim::Optimizer& opt = optimizer();
  Tensor& master = offloaded_ ? offloaded_->master() : store_.flat_params();
  for (int i = 0; i < store_.size(); ++i) {
    const auto& p = store_.infos()[static_cast<std::size_t>(i)];
    // m, v: the optimizer's state tensors 0 and 1 (empty where it holds none, e.g. sgd's v).
    auto views = [&](std::int64_t a, std::int64_t b) {
      return std::array<Tensor, 3>{master.flat_range(p.offset + a, b - a),
                                   state_view(opt, 0, p.offset + a, b - a), state_view(opt, 1, p.offset + a, b - a)};
    };
    auto all = views(0, p.numel);
    append_full_pieces(out.load, p, store_.global_index(i), 0, p.numel, all[0], all[1], all[2]);
    const auto [a, b] = writer_slice(p);
    if (a < b) {
      auto mine = views(a, b);
      append_full_pieces(out.save, p, store_.global_index(i), a, b, mine[0], mine[1], mine[2]);
    }
  }
  return out;
}

}  // namespace lmscale::parallel

namespace lmscale::parallel {

void ReplicatedStrategy::set_optimizer_steps(std::int64_t steps) {
  settle();
  if (offloaded_) {   // a checkpoint load wrote the host master: the device weights from it, now
    offloaded_->mark_master_changed();
    offloaded_->wait_unit(rt_.ctx(), 0);   // (nothing in flight: rebuilds the targets)
  }
  optimizer().set_steps(steps);
}

std::vector<float> ReplicatedStrategy::master_parameters(Context& ctx) {
  if (!offloaded_) return Strategy::master_parameters(ctx);
  settle();
  const Tensor& m = offloaded_->master();
  return std::vector<float>(m.data_as<const float>(), m.data_as<const float>() + m.numel());
}

void ReplicatedStrategy::set_master_parameters(Context& ctx, const std::vector<float>& values) {
  Strategy::set_master_parameters(ctx, values);
  if (!offloaded_) return;
  LMSCALE_CHECK(static_cast<std::int64_t>(values.size()) == offloaded_->master().numel(), "set_master_parameters: {} values",
                values.size());
  std::memcpy(offloaded_->master().data(), values.data(), values.size() * sizeof(float));
  offloaded_->mark_master_changed();
  offloaded_->wait_unit(ctx, 0);   // (nothing in flight: rebuilds the targets from the master)
}

}  // namespace lmscale::parallel
