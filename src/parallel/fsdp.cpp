#include "lmscale/parallel/fsdp.h"

#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/grad_clip.h"

namespace lmscale::parallel {

namespace {
// Reduce-scatters allowed in flight behind the backward before the oldest is completed (its
// full-size gradients freed): a unit's reduction overlaps the next unit's backward. One is
// enough to hide it (xl: a block's 164 MB reduce-scatter takes less than its backward) and
// each more costs a unit's fp32 gradients of memory.
constexpr std::size_t kReductionsInFlight = 1;
}  // namespace

FsdpOptions FsdpOptions::from(const ParallelConfig& p) {
  FsdpOptions o;
  o.prefetch = static_cast<int>(p.fsdp_prefetch);
  o.reshard_after_forward = p.reshard_after_forward;
  o.offload_optimizer = p.offload != OffloadMode::none;
  o.offload_params = p.offload == OffloadMode::optimizer_params;
  o.offload_delayed_update = p.offload_delayed_update;
  return o;
}

// The hooks the model calls; finish() completes the step's reductions.
class FullyShardedDataParallel::Sync final : public GradientSync {
 public:
  explicit Sync(FullyShardedDataParallel& f) : f_(f) {}

  model::ParallelContext forward_hooks(bool training) override {
    if (training && f_.step_open_) {   // the last backward had no finish() (bench forward-backward)
      f_.complete_reductions(0);
      f_.collect_waits();
      f_.step_open_ = false;
    }
    f_.training_ = training;
    model::ParallelContext pc;
    pc.before_forward = [this](int u) { before_forward(u); };
    pc.after_forward = [this](int u) { after_forward(u); };
    return pc;
  }

  model::ParallelContext hooks(int micro, int micro_count) override {
    f_.micro_ = micro;
    f_.step_open_ = micro + 1 == micro_count;
    model::ParallelContext pc;
    // Each backward hook says which micro-batch it reduces: under a pipeline schedule the hooks
    // of several micro-batches are handed out before their backwards run (parallel/pipeline.h).
    pc.before_backward = [this, micro](int u) {
      f_.micro_ = micro;
      before_backward(u);
    };
    pc.after_backward = [this, micro](int u) {
      f_.micro_ = micro;
      after_backward(u);
    };
    return pc;
  }

  void finish(Context& ctx) override {
    NvtxRange r("fsdp_finish");
    f_.complete_reductions(0);
    f_.comm_.all_reduce(f_.norm_grads_, comm::ReduceOp::sum).wait();
    (void)ctx;
    f_.collect_waits();
    f_.step_open_ = false;
  }

  double sum_scalar(double x) override { return comm::sum_over(f_.host_, x); }
  std::string name() const override { return "fsdp"; }
  // A unit's parameters are reduce-scattered per micro-batch (after_backward); the replicated
  // norms accumulate in norm_grads_ and are summed once, in finish().
  bool reduces_every_micro_batch(int param) const override {
    return f_.unit_of_[static_cast<std::size_t>(param)] >= 0;
  }

 private:
  int last_unit() const { return f_.num_units() - 1; }

  void before_forward(int u) {
    for (int j = u; j <= std::min(u + f_.opt_.prefetch, last_unit()); ++j)
      if (f_.gathered_[static_cast<std::size_t>(j)].state == State::released) f_.issue_gather(j);
    f_.wait_gather(u, false);
  }
  void after_forward(int u) {
    const bool keep = f_.training_ && (!f_.opt_.reshard_after_forward || u == last_unit());
    if (!keep) f_.release(u);
  }
  void before_backward(int u) {
    // The embedding's backward reads no weights (a scatter-add of the incoming gradient).
    if (u > 0 && f_.gathered_[static_cast<std::size_t>(u)].state == State::released) f_.issue_gather(u);
    for (int j = u - 1; j >= std::max(1, u - f_.opt_.prefetch); --j)
      if (f_.gathered_[static_cast<std::size_t>(j)].state == State::released) f_.issue_gather(j);
    if (u > 0) f_.wait_gather(u, true);
  }
  void after_backward(int u) {
    f_.release(u);
    f_.reduce_scatter(u);
    f_.complete_reductions(kReductionsInFlight);
  }

  FullyShardedDataParallel& f_;
};

std::vector<int> FullyShardedDataParallel::fp8_group_sizes(const Unit& unit,
                                                          const std::vector<std::vector<int>>& groups) const {
  // Each weight of the unit in slot order: a group's members must follow one another (then
  // their gathered bytes lie back to back, one [sum R_i, K] matrix under one scale).
  std::vector<int> sizes;
  for (std::size_t k = 0; k < unit.params.size();) {
    const int i = unit.params[k];
    const std::vector<int>* group = nullptr;
    for (const auto& g : groups)
      if (!g.empty() && g.front() == i) group = &g;
    const std::size_t n = group ? group->size() : 1;
    for (std::size_t j = 0; j < n; ++j)
      LMSCALE_CHECK(!group || (k + j < unit.params.size() && unit.params[k + j] == (*group)[j]),
                    "parallel.fsdp_gather_dtype = fp8: {} shares an FP8 scale with weights that do not follow it in "
                    "its fsdp unit (set parallel.fsdp_gather_dtype = compute)",
                    store_.infos()[static_cast<std::size_t>(i)].name);
    sizes.push_back(static_cast<int>(n));
    k += n;
  }
  return sizes;
}

template <class Fn>
void FullyShardedDataParallel::for_each_piece(const Unit& u, Fn&& fn) const {
  const std::int64_t lo = comm_.rank() * u.shard, hi = std::min(lo + u.shard, u.numel);
  for (std::size_t k = 0; k < u.params.size(); ++k) {
    const auto& p = store_.infos()[static_cast<std::size_t>(u.params[k])];
    const std::int64_t a = std::max(lo, u.offsets[k]), b = std::min(hi, u.offsets[k] + p.numel);
    if (a < b) fn(u.params[k], a - u.offsets[k], b - a, a - lo);
  }
}

FullyShardedDataParallel::FullyShardedDataParallel(model::ParameterStore& store, comm::Communicator& comm,
                                                   comm::Communicator& host, const OptimConfig& cfg,
                                                   const FsdpOptions& opt, std::uint64_t seed, ops::Runtime& rt)
    : store_(store), comm_(comm), host_(host), rt_(rt), opt_(opt), compute_(store.lowp_dtype()) {
  LMSCALE_CHECK(!store.has_flat_params() && !store.has_flat_grads(),
                "FSDP needs a parameter store without flat buffers (Buffers::none)");
  LMSCALE_CHECK(opt.prefetch >= 0, "parallel.fsdp_prefetch {} < 0", opt.prefetch);
  Context& ctx = rt.ctx();
  Allocator& A = *ctx.allocator;
  const DType master = store.master_dtype();
  const auto& infos = store.infos();
  // Units: 0 = embedding, 1..L = blocks, L+1 = final norm and head (model/parallel_context.h).
  int layers = 0;
  for (const auto& p : infos) layers = std::max(layers, p.layer + 1);
  units_.resize(static_cast<std::size_t>(layers + 2));
  unit_of_.assign(infos.size(), -1);
  local_.assign(infos.size(), 0);
  std::int64_t norms = 0;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& p = infos[i];
    if (p.kind == model::ParamInfo::Kind::norm) {
      local_[i] = norms;
      norms += p.numel;
      continue;
    }
    const int u = p.kind == model::ParamInfo::Kind::embedding ? 0 : (p.layer >= 0 ? p.layer + 1 : layers + 1);
    Unit& unit = units_[static_cast<std::size_t>(u)];
    unit_of_[i] = u;
    local_[i] = unit.numel;
    unit.params.push_back(static_cast<int>(i));
    unit.offsets.push_back(unit.numel);
    unit.numel += p.numel;
  }
  const int dp = comm.size();
  std::int64_t S = 0;
  for (auto& u : units_) {
    u.shard = (u.numel + dp - 1) / dp;
    u.shard_offset = S;
    S += u.shard;
  }
  if (opt.offload_optimizer) {
    LMSCALE_CHECK(master == DType::f32, "parallel.offload: fp32 master weights only");
    std::vector<OffloadedShards::Range> ranges;
    for (const auto& u : units_) ranges.push_back({u.shard_offset, u.shard});
    offloaded_ = std::make_unique<OffloadedShards>(
        rt, S, std::move(ranges), compute_, cfg, opt.offload_threads,
        opt.offload_params ? OffloadedShards::ShardCopy::pinned_host : OffloadedShards::ShardCopy::device,
        OffloadedShards::kChunk, opt.offload_delayed_update);
    master_ = offloaded_->master();   // host, zeros
  } else {
    master_ = Tensor::empty({S}, master, A, "parameters");
    ops::fill(ctx, master_, 0.0);
  }
  grad_shard_ = Tensor::empty({S}, master, A, "gradient_shard");
  norm_master_ = Tensor::empty({norms}, master, A, "parameters");
  norm_grads_ = Tensor::empty({norms}, master, A, "gradients");

  // Initial values: each rank computes its own pieces from (seed, name, full element index), also
  // when a piece is a range of a tensor-parallel slice; padding is 0 (filled above).
  for (const auto& u : units_)
    for_each_piece(u, [&](int i, std::int64_t begin, std::int64_t n, std::int64_t at) {
      model::fill_slice_initial_values(infos[static_cast<std::size_t>(i)], seed, begin, begin + n,
                                       master_.flat_range(u.shard_offset + at, n), ctx);
    });
  for (std::size_t i = 0; i < infos.size(); ++i)
    if (unit_of_[i] < 0)
      model::fill_initial_values(infos[i], seed, 0, infos[i].numel, norm_master_.flat_range(local_[i], infos[i].numel), ctx);
  ops::fill(ctx, grad_shard_, 0.0);
  ops::fill(ctx, norm_grads_, 0.0);
  std::vector<optim::ParamSegment> shard_segments, norm_segments;
  for (const auto& u : units_)
    for_each_piece(u, [&](int i, std::int64_t, std::int64_t n, std::int64_t at) {
      shard_segments.push_back({u.shard_offset + at, n, i, true});
    });
  for (std::size_t i = 0; i < infos.size(); ++i)
    if (unit_of_[i] < 0) norm_segments.push_back({local_[i], infos[i].numel, static_cast<int>(i), false});
  const int P = static_cast<int>(infos.size());
  if (!offloaded_) optimizer_ = optim::make_optimizer(cfg, S, master, ctx, P, std::move(shard_segments));
  norm_optimizer_ = optim::make_optimizer(cfg, norms, master, ctx, P, std::move(norm_segments));

  gathered_.resize(units_.size());
  unit_grads_.resize(units_.size());
  // FP8 weight gathers: the blocks' units (1..L), whose sharded weights are all FP8 GEMM weights
  // (q, k, v, o, w1, w3, w2; precision.mode = fp8 refuses MoE and tensor parallelism).
  fp8_scales_.resize(units_.size());
  fp8_pieces_.resize(units_.size());
  slot_.assign(infos.size(), -1);
  for (const Unit& unit : units_)
    for (std::size_t k = 0; k < unit.params.size(); ++k)
      slot_[static_cast<std::size_t>(unit.params[k])] = static_cast<int>(k);
  if (opt.gather_fp8)
    for (int u = 1; u <= layers; ++u) {
      const Unit& unit = units_[static_cast<std::size_t>(u)];
      if (unit.numel == 0) continue;   // a pipeline stage's unit held elsewhere
      for (int i : unit.params) {
        const auto& p = infos[static_cast<std::size_t>(i)];
        LMSCALE_CHECK(p.kind == model::ParamInfo::Kind::linear,
                      "parallel.fsdp_gather_dtype = fp8: {} is not a linear layer's weight", p.name);
      }
      fp8_scales_[static_cast<std::size_t>(u)] =
          std::make_unique<FsdpFp8Scales>(ctx, fp8_group_sizes(unit, opt.fp8_groups), opt.fp8_margin);
      for_each_piece(unit, [&](int i, std::int64_t, std::int64_t n, std::int64_t at) {
        fp8_pieces_[static_cast<std::size_t>(u)].push_back({slot_[static_cast<std::size_t>(i)], at, n});
      });
    }
  waits_.forward_ms.assign(units_.size(), 0.0);
  waits_.backward_ms.assign(units_.size(), 0.0);
  sync_ = std::make_unique<Sync>(*this);
  store_.set_weight_provider([this](int i) { return weight(i); });
  store_.set_grad_provider([this](int i) { return grad(i); });
  if (opt.gather_fp8) store_.set_fp8_weight_provider([this](int i) { return fp8_weight(i); });
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  store_.set_weight_provider(nullptr);
  store_.set_grad_provider(nullptr);
  store_.set_fp8_weight_provider(nullptr);
  if (unwinding()) return;   // no waiting for peers while an exception unwinds (core/error.h)
  try {
    complete_reductions(0);
  } catch (...) {   // a failed collective already ends the job; never throw from a destructor
  }
}

GradientSync& FullyShardedDataParallel::sync() { return *sync_; }

void FullyShardedDataParallel::issue_gather(int u) {
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  // A pipeline stage's store numbers units as the whole model does and holds only its own: the
  // others are empty and never gathered (a prefetch may name one across the stage boundary).
  if (unit.numel == 0) return;
  Gathered& g = gathered_[static_cast<std::size_t>(u)];
  Allocator& A = *rt_.ctx().allocator;
  Tensor shard = offloaded_ ? offloaded_->device_shard(rt_.ctx(), u) : master_.flat_range(unit.shard_offset, unit.shard);
  // optimizer+params: the shard was copied up into a buffer of its own, kept like the cast's.
  if (opt_.offload_params) g.send = shard;
  if (!offloaded_ && compute_ != master_.dtype()) {   // mixed precision: the low-precision copy travels (half the bytes)
    g.send = Tensor::empty({unit.shard}, compute_, A, "fsdp_cast");
    ops::cast(rt_.ctx(), shard, g.send);
    shard = g.send;
  }
  FsdpFp8Scales* fp8 = fp8_scales_[static_cast<std::size_t>(u)].get();
  if (fp8) {   // the e4m3 bytes travel (parallel/fsdp_fp8_gather.h); the compute-dtype cast is freed
    if (opt_.offload_params) g.staged = g.send;
    g.send = Tensor::empty({unit.shard}, DType::e4m3, A, "fsdp_cast");
    fp8->cast_shard(rt_.ctx(), comm_, shard, fp8_pieces_[static_cast<std::size_t>(u)], g.send);
    shard = g.send;
  }
  g.buffer = Tensor::empty({unit.shard * comm_.size()}, fp8 ? DType::e4m3 : compute_, A, "fsdp_gathered");
  g.work = comm_.all_gather(shard, g.buffer, comm::async_call());
  g.state = State::in_flight;
}

void FullyShardedDataParallel::wait_gather(int u, bool backward) {
  Gathered& g = gathered_[static_cast<std::size_t>(u)];
  if (g.state == State::released) issue_gather(u);
  if (g.state == State::ready) return;
  if (training_ || backward) {
    WaitMarks m;
    m.unit = u;
    m.backward = backward;
    m.before = rt_.mark();
    g.work.wait();
    m.after = rt_.mark();
    marks_.push_back(std::move(m));
  } else {
    g.work.wait();
  }
  g.send = Tensor();   // the compute stream now follows the gather, which has read it
  g.staged = Tensor();
  g.state = State::ready;
}

void FullyShardedDataParallel::release(int u) {
  Gathered& g = gathered_[static_cast<std::size_t>(u)];
  if (g.state == State::in_flight) g.work.wait();   // never free memory a collective still writes
  g.buffer = Tensor();
  g.send = Tensor();
  g.staged = Tensor();
  g.work = comm::Work();
  g.state = State::released;
}

void FullyShardedDataParallel::reduce_scatter(int u) {
  Tensor& full = unit_grads_[static_cast<std::size_t>(u)];
  if (!full.defined() || full.data() == nullptr) return;   // nothing of this unit was written
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  PendingReduction p;
  p.offset = unit.shard_offset;
  p.count = unit.shard;
  p.full = full;
  full = Tensor();
  Tensor shard = grad_shard_.flat_range(p.offset, p.count);
  if (micro_ == 0) {
    p.work = comm_.reduce_scatter(p.full, shard, comm::ReduceOp::sum, comm::async_call());
  } else {   // later micro-batches add their sum into the shard once it has arrived
    p.temp = Tensor::empty({p.count}, grad_shard_.dtype(), *rt_.ctx().allocator, "gradient_shard");
    p.work = comm_.reduce_scatter(p.full, p.temp, comm::ReduceOp::sum, comm::async_call());
  }
  pending_.push_back(std::move(p));
}

void FullyShardedDataParallel::complete_reductions(std::size_t keep_in_flight) {
  Context& ctx = rt_.ctx();
  std::size_t done = 0;
  while (pending_.size() - done > keep_in_flight) {
    PendingReduction& p = pending_[done++];
    p.work.wait();
    if (p.temp.defined()) {
      Tensor shard = grad_shard_.flat_range(p.offset, p.count);
      ops::add(ctx, shard, p.temp, shard);
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
}

Tensor FullyShardedDataParallel::weight(int i) {
  const auto& p = store_.infos()[static_cast<std::size_t>(i)];
  const int u = unit_of_[static_cast<std::size_t>(i)];
  if (u < 0) return norm_master_.flat_range(local_[static_cast<std::size_t>(i)], p.numel).reshape(p.shape);
  const Gathered& g = gathered_[static_cast<std::size_t>(u)];
  LMSCALE_CHECK(g.state == State::ready, "FSDP: weight {} used outside its unit's hooks (unit {} not gathered)", p.name, u);
  return g.buffer.flat_range(local_[static_cast<std::size_t>(i)], p.numel).reshape(p.shape);
}

ops::Fp8Weight FullyShardedDataParallel::fp8_weight(int i) {
  const int u = unit_of_[static_cast<std::size_t>(i)];
  const FsdpFp8Scales* fp8 = u < 0 ? nullptr : fp8_scales_[static_cast<std::size_t>(u)].get();
  LMSCALE_CHECK(fp8, "FSDP: weight {} is not gathered in FP8", store_.infos()[static_cast<std::size_t>(i)].name);
  return fp8->weight(slot_[static_cast<std::size_t>(i)], weight(i));
}

Tensor FullyShardedDataParallel::grad(int i) {
  const auto& p = store_.infos()[static_cast<std::size_t>(i)];
  const int u = unit_of_[static_cast<std::size_t>(i)];
  if (u < 0) return norm_grads_.flat_range(local_[static_cast<std::size_t>(i)], p.numel).reshape(p.shape);
  Tensor& full = unit_grads_[static_cast<std::size_t>(u)];
  if (!full.defined() || full.data() == nullptr) {
    const Unit& unit = units_[static_cast<std::size_t>(u)];
    const std::int64_t padded = unit.shard * comm_.size();
    full = Tensor::empty({padded}, store_.master_dtype(), *rt_.ctx().allocator, "gradients");
    // The first micro-batch's backward overwrites every gradient; later ones add, and each of
    // them starts from a fresh buffer (the previous one was reduce-scattered). The padding is
    // summed into the last shard and must be 0.
    Tensor zero = micro_ == 0 ? full.flat_range(unit.numel, padded - unit.numel) : full;
    if (zero.numel() > 0) ops::fill(rt_.ctx(), zero, 0.0);
  }
  return full.flat_range(local_[static_cast<std::size_t>(i)], p.numel).reshape(p.shape);
}

void FullyShardedDataParallel::collect_waits() {
  for (const auto& m : marks_) {
    auto& sum = m.backward ? waits_.backward_ms : waits_.forward_ms;
    sum[static_cast<std::size_t>(m.unit)] += rt_.elapsed_ms(m.before, m.after);
  }
  if (!marks_.empty()) ++waits_.steps;
  marks_.clear();
}

void FullyShardedDataParallel::reset_waits() {
  std::fill(waits_.forward_ms.begin(), waits_.forward_ms.end(), 0.0);
  std::fill(waits_.backward_ms.begin(), waits_.backward_ms.end(), 0.0);
  waits_.steps = 0;
}

double FullyShardedDataParallel::grad_sum_squares(Context& ctx) {
  // Shards are disjoint (padding is 0); the replicated norms count once, on rank 0.
  double local = optim::sum_of_squares(ctx, grad_shard_);
  if (comm_.rank() == 0) local += optim::sum_of_squares(ctx, norm_grads_);
  return sync_->sum_scalar(local);
}

double FullyShardedDataParallel::grad_sum_squares_in(Context& ctx,
                                                     const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  // The parts of the ranges in this rank's shards, and in the replicated norms on rank 0 only
  // (as grad_sum_squares counts them); summed over the data-parallel ranks.
  const auto& infos = store_.infos();
  std::vector<Tensor> parts;
  for (const auto& [offset, numel] : ranges) {
    for (std::size_t i = 0; i < infos.size(); ++i) {
      const auto& p = infos[i];
      const std::int64_t a = std::max(offset, p.offset) - p.offset, b = std::min(offset + numel, p.offset + p.numel) - p.offset;
      if (a >= b) continue;   // [a, b): elements of parameter i inside the range
      const int u = unit_of_[i];
      if (u < 0) {
        if (comm_.rank() == 0) parts.push_back(norm_grads_.flat_range(local_[i] + a, b - a));
        continue;
      }
      const Unit& unit = units_[static_cast<std::size_t>(u)];
      for_each_piece(unit, [&](int j, std::int64_t begin, std::int64_t n, std::int64_t at) {
        if (j != static_cast<int>(i)) return;
        const std::int64_t x = std::max(a, begin), y = std::min(b, begin + n);
        if (x < y) parts.push_back(grad_shard_.flat_range(unit.shard_offset + at + (x - begin), y - x));
      });
    }
  }
  const double local = parts.empty() ? 0.0 : optim::sum_of_squares(ctx, parts);
  return sync_->sum_scalar(local);
}

void FullyShardedDataParallel::step(Context& ctx, double lr, double grad_scale) {
  NvtxRange r("fsdp_step");
  if (offloaded_) {   // AdamW only (no layer-wise norms): the host takes the shards from here
    offloaded_->start_step(ctx, grad_shard_, lr, grad_scale);
    norm_optimizer_->step(ctx, norm_master_, norm_grads_, nullptr, lr, grad_scale);
    return;
  }
  optimizer_->begin_step();
  if (optimizer_->layerwise()) {
    // Per-parameter partial sums over this rank's pieces, summed over the ranks: norms of the
    // whole parameters (a unit's shards cut its parameters anywhere).
    std::vector<double> sums(optimizer_->norm_slots(), 0.0), total(sums.size());
    optimizer_->accumulate_norms(ctx, master_, grad_shard_, 0, grad_scale, sums);
    host_.all_reduce(sums.data(), total.data(), sums.size(), DType::f64, comm::ReduceOp::sum).wait();
    if (norm_reducer_) norm_reducer_(total);
    optimizer_->set_norms(total);
  }
  optimizer_->step_range(ctx, master_, grad_shard_, nullptr, 0, lr, grad_scale);
  // The norms are whole on every rank (replicated): a plain step.
  norm_optimizer_->step(ctx, norm_master_, norm_grads_, nullptr, lr, grad_scale);
}

std::size_t FullyShardedDataParallel::state_bytes() const {
  return shard_optimizer().state_bytes() + norm_optimizer_->state_bytes();
}

std::int64_t FullyShardedDataParallel::steps() const { return shard_optimizer().steps(); }

optim::Optimizer& FullyShardedDataParallel::shard_optimizer() {
  return offloaded_ ? static_cast<optim::Optimizer&>(offloaded_->optimizer()) : *optimizer_;
}
const optim::Optimizer& FullyShardedDataParallel::shard_optimizer() const {
  return offloaded_ ? static_cast<const optim::Optimizer&>(offloaded_->optimizer()) : *optimizer_;
}

void FullyShardedDataParallel::settle_offload() {
  if (offloaded_) offloaded_->settle();
}

std::vector<float> FullyShardedDataParallel::full_parameters(Context& ctx) {
  LMSCALE_CHECK(store_.master_dtype() == DType::f32, "full_parameters: fp32 master weights only");
  const auto& infos = store_.infos();
  settle_offload();
  std::vector<float> out(static_cast<std::size_t>(store_.numel()));
  for (const auto& unit : units_) {
    Tensor full = Tensor::empty({unit.shard * comm_.size()}, master_.dtype(), *ctx.allocator, "fsdp_gathered");
    Tensor shard = master_.flat_range(unit.shard_offset, unit.shard);
    if (shard.device() != ctx.device) {   // an offloaded master: the collective reads device memory
      Tensor on_device = Tensor::empty({unit.shard}, master_.dtype(), *ctx.allocator, "fsdp_gathered");
      ops::copy(ctx, shard, on_device);
      shard = on_device;
    }
    comm_.all_gather(shard, full).wait();
    for (std::size_t k = 0; k < unit.params.size(); ++k) {
      const auto& p = infos[static_cast<std::size_t>(unit.params[k])];
      Tensor dst = Tensor::view(out.data() + p.offset, {p.numel}, DType::f32, Device::cpu);
      ops::copy(ctx, full.flat_range(unit.offsets[k], p.numel), dst);
    }
  }
  for (std::size_t i = 0; i < infos.size(); ++i) {
    if (unit_of_[i] >= 0) continue;
    Tensor dst = Tensor::view(out.data() + infos[i].offset, {infos[i].numel}, DType::f32, Device::cpu);
    ops::copy(ctx, norm_master_.flat_range(local_[i], infos[i].numel), dst);
  }
  return out;
}

void FullyShardedDataParallel::set_parameters(Context& ctx, const std::vector<float>& full) {
  LMSCALE_CHECK(static_cast<std::int64_t>(full.size()) == store_.numel(), "set_parameters: {} values for {}",
                full.size(), store_.numel());
  settle_offload();
  if (offloaded_) offloaded_->mark_master_changed();
  const auto& infos = store_.infos();
  auto host = [&](std::int64_t at, std::int64_t n) {
    return Tensor::view(const_cast<float*>(full.data()) + at, {n}, DType::f32, Device::cpu);
  };
  for (const auto& u : units_)
    for_each_piece(u, [&](int i, std::int64_t begin, std::int64_t n, std::int64_t at) {
      Tensor dst = master_.flat_range(u.shard_offset + at, n);
      ops::copy(ctx, host(infos[static_cast<std::size_t>(i)].offset + begin, n), dst);
    });
  for (std::size_t i = 0; i < infos.size(); ++i) {
    if (unit_of_[i] >= 0) continue;
    Tensor dst = norm_master_.flat_range(local_[i], infos[i].numel);
    ops::copy(ctx, host(infos[i].offset, infos[i].numel), dst);
  }
}

StateLayout FullyShardedDataParallel::state_layout() {
  // The views reach the offloaded master and moments: no step may be in flight. A load through
  // them is followed by set_steps(), which rebuilds the device copy from the master.
  settle_offload();
  StateLayout out;
  optim::Optimizer& shard_opt = shard_optimizer();
  const auto& infos = store_.infos();
  const model::TensorSplit& tp = store_.tensor_split();
  // Sharded parameters: each rank's pieces are disjoint by construction (padding holds no
  // parameter), so what it holds is what it writes. Under tensor parallelism a piece is a range
  // of this rank's slice, named in the full parameter's coordinates (a row-parallel slice: one
  // piece per row it touches).
  for (const auto& u : units_)
    for_each_piece(u, [&](int i, std::int64_t begin, std::int64_t n, std::int64_t at) {
      const std::int64_t o = u.shard_offset + at;
      const auto& p = infos[static_cast<std::size_t>(i)];
      const Tensor master = master_.flat_range(o, n), m = state_view(shard_opt, 0, o, n),
                   v = state_view(shard_opt, 1, o, n);
      append_full_pieces(out.save, p, store_.global_index(i), begin, begin + n, master, m, v);
      append_full_pieces(out.load, p, store_.global_index(i), begin, begin + n, master, m, v);
    });
  // Norms are replicated over the dp ranks and the tp ranks: every rank loads all of them and
  // writes its 1/(dp x tp) slice.
  const int writers = comm_.size() * tp.degree, writer = comm_.rank() * tp.degree + tp.rank;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    if (unit_of_[i] >= 0) continue;
    const std::int64_t o = local_[i], n = infos[i].numel;
    const int p = store_.global_index(static_cast<int>(i));
    out.load.push_back({p, 0, n, norm_master_.flat_range(o, n), state_view(*norm_optimizer_, 0, o, n),
                        state_view(*norm_optimizer_, 1, o, n)});
    const auto [a, b] = slice_of(n, writer, writers);
    if (a < b)
      out.save.push_back({p, a, b, norm_master_.flat_range(o + a, b - a), state_view(*norm_optimizer_, 0, o + a, b - a),
                          state_view(*norm_optimizer_, 1, o + a, b - a)});
  }
  return out;
}

void FullyShardedDataParallel::set_steps(std::int64_t t) {
  settle_offload();
  if (offloaded_) offloaded_->mark_master_changed();   // a checkpoint load wrote the master (state_layout)
  shard_optimizer().set_steps(t);
  norm_optimizer_->set_steps(t);
}

}  // namespace lmscale::parallel
