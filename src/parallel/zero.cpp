#include "lmscale/parallel/zero.h"

#include <algorithm>
#include <optional>

#include "lmscale/comm/peer_copy.h"
#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/parallel/bucket_reducer.h"
#include "lmscale/parallel/rank_order_sum.h"
#include "lmscale/parallel/reductions_in_flight.h"

#include "gather_in_place.h"

namespace lmscale::parallel {

namespace {

// Rank q's part of the elements [offset, offset + n): [begin, begin + count) of the group, and
// where q's range starts (ranks hold consecutive ranges of counts[q] elements from 0).
struct RankPart {
  std::int64_t begin = 0, count = 0, range_begin = 0;
  std::int64_t at() const { return begin - range_begin; }   // in q's range (its grad_shard)
};
std::vector<RankPart> rank_parts(const std::vector<std::size_t>& counts, std::int64_t offset, std::int64_t n) {
  std::vector<RankPart> parts(counts.size());
  std::int64_t lo = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    const std::int64_t hi = lo + static_cast<std::int64_t>(counts[q]);
    const std::int64_t a = std::max(lo, offset), e = std::min(hi, offset + n);
    parts[q] = e > a ? RankPart{a, e - a, lo} : RankPart{lo, 0, lo};
    lo = hi;
  }
  return parts;
}

// Per rank: how many of the elements [offset, offset + n) lie in its range.
std::vector<std::size_t> counts_in(const std::vector<std::size_t>& counts, std::int64_t offset, std::int64_t n) {
  std::vector<std::size_t> in;
  for (const RankPart& p : rank_parts(counts, offset, n)) in.push_back(static_cast<std::size_t>(p.count));
  return in;
}

}  // namespace

ZeroMode zero_mode_of(ZeroLevel level) {
  switch (level) {
    case ZeroLevel::zero1_broadcast: return ZeroMode::zero1_broadcast;
    case ZeroLevel::zero1: return ZeroMode::zero1;
    case ZeroLevel::zero2: return ZeroMode::zero2;
    case ZeroLevel::none:
    case ZeroLevel::fsdp: break;
  }
  throw UsageError(fmt::format("parallel.zero = {} is not a sharded-optimizer mode (zero1-broadcast, zero1, zero2)", level));
}

std::vector<std::size_t> even_split(std::int64_t n, int size) {
  std::vector<std::size_t> c(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) c[static_cast<std::size_t>(r)] = static_cast<std::size_t>(n / size + (r < n % size ? 1 : 0));
  return c;
}

// zero1: one reduce-scatter of all gradients after the backward. zero2: a reduce-scatter per
// bucket as soon as the backward has finished the bucket. Either way rank r ends with the sum of
// its range of every group's gradients in that shard's grad_shard.
// When the model's store has no flat gradient buffer (zero2 in the trainer), this object is also
// the store's gradient provider: each bucket's gradients live in their own buffer, allocated when
// the backward first writes into the bucket (after the activations of later layers are freed) and
// released once the bucket is reduce-scattered, so the full-size gradients never exist at once.
class ReduceScatterSync final : public GradientSync, private BucketBackend {
 public:
  // zero2 (store given): the gradient bucket reducer over buckets of at most bucket_bytes
  // launches each bucket's reduce-scatter (parallel/bucket_reducer.h); zero1: no buckets.
  ReduceScatterSync(ZeroOptimizer& z, double bucket_bytes, model::ParameterStore* store, Context* ctx)
      : z_(z), store_(store), ctx_(ctx) {
    if (!store_) return;
    if (!store_->has_flat_grads())
      lazy_ = std::make_unique<parallel::LazyGradients>(*store_, bucket_bytes, *ctx_->allocator);
    reducer_.emplace(lazy_ ? lazy_->buckets()
                           : gradient_buckets(store_->infos(), bucket_bytes, dtype_size(store_->master_dtype())),
                     store_->size(), static_cast<BucketBackend&>(*this));
  }

  model::ParallelContext hooks(int micro, int micro_count) override {
    return reducer_ ? reducer_->hooks(micro, micro_count) : model::ParallelContext{};
  }

  void finish(Context& ctx) override {
    (void)ctx;
    NvtxRange r("zero_reduce_scatter");
    if (!reducer_ || !reducer_->armed()) {   // zero1, or no backward hooks ran: each group in one reduce-scatter
      for (auto& s : z_.shards_) {
        LMSCALE_CHECK(s.g.grads.defined() && s.g.grads.data() != nullptr,
                      "zero2 without a backward: this group's gradients live only in bucket buffers");
        scatter_range(s, s.g.grads.data(), 0, s.g.grads.numel(), false).wait();
      }
    } else {
      reducer_->finish();
      // Reduced: the bucket buffers are no longer needed (complete()'s waits ordered the compute
      // stream after the reduce-scatters, so the memory can be reused by later compute work).
      if (lazy_) lazy_->release();
      for (std::size_t i = 1; i < z_.shards_.size(); ++i)
        scatter_range(z_.shards_[i], z_.shards_[i].g.grads.data(), 0, z_.shards_[i].g.grads.numel(), false).wait();
    }
  }

  double sum_scalar(double x) override { return comm::sum_over(z_.host_, x); }
  std::string name() const override { return reducer_ && !reducer_->buckets().empty() ? "zero2" : "zero1"; }

  void set_reduce_dtype(std::optional<DType> t) { reduce_dtype_ = t; }
  // zero2 over CUDA: the exchange's window holds one shard-sized slot per other rank (the largest
  // shard: even_split puts the extra elements first) and a flag per bucket and other rank.
  void use_copy_engine() {
    LMSCALE_CHECK(store_ && !reduce_dtype_ && z_.shards_.size() == 1 && ctx_->device == Device::cuda,
                  "parallel.grad_exchange = copy-engine needs zero2 over CUDA with fp32 gradients and one group");
    const ZeroOptimizer::Shard& s = z_.shards_[0];
    exchange_ = comm::make_peer_copy_exchange(z_.host_, s.counts[0] * dtype_size(s.grad_shard.dtype()),
                                              &ctx_->allocator->tracker(), static_cast<int>(reducer_->buckets().size()));
  }

 private:
  // BucketBackend, armed on the last micro-batch's hooks: a new round of the copy-engine exchange.
  void begin_step() override {
    inflight_.clear();
    own_.clear();
    if (exchange_) {
      exchange_->begin();
      ++round_;
    }
  }
  // Bucket b is complete: its reduce-scatter (in the gradients' dtype, or staged), or its peer
  // copies to the ranks that own its parts.
  void launch(int b) override {
    const GradBucket& k = bucket(b);
    if (exchange_)
      put_bucket(b);
    else if (!reduce_dtype_)
      inflight_.add(scatter_range(z_.shards_[0], bucket_source(b), k.offset, k.numel, true));
    else
      scatter_range_staged(z_.shards_[0], b);
  }
  // After the backward: the exchange's sums, then the collectives' waits (and widening).
  void complete() override {
    if (exchange_) end_exchange();
    inflight_.wait(ctx_);
  }

  const GradBucket& bucket(int b) const { return reducer_->buckets()[static_cast<std::size_t>(b)]; }
  // Bucket b's gradients [numel]: its own buffer (lazy), else its range of the flat buffer.
  Tensor bucket_grads(int b) {
    if (lazy_) return lazy_->bucket(b);
    const GradBucket& k = bucket(b);
    return z_.shards_[0].g.grads.flat_range(k.offset, k.numel);
  }
  // Element `offset` of the group's gradients (the bucket's first) is at the returned pointer.
  const void* bucket_source(int b) { return bucket_grads(b).data(); }
  // Reduce-scatters elements [offset, offset+n) of a group's gradients, read from `send` (the
  // address of element `offset`): rank r receives the part in its range into its grad_shard.
  comm::Work scatter_range(ZeroOptimizer::Shard& s, const void* send, std::int64_t offset, std::int64_t n, bool async) {
    return scatter_into(s, send, nullptr, s.grad_shard.dtype(), offset, n, async);
  }
  // recv: where this rank's part goes (null: its place in grad_shard); dtype: of send and recv.
  comm::Work scatter_into(ZeroOptimizer::Shard& s, const void* send, void* recv_at, DType dtype, std::int64_t offset,
                          std::int64_t n, bool async) {
    const std::vector<std::size_t> counts = counts_in(s.counts, offset, n);
    const std::int64_t mine_at = rank_parts(s.counts, offset, n)[static_cast<std::size_t>(z_.grads_.rank())].at();
    const std::size_t esz = dtype_size(s.grad_shard.dtype());
    void* recv = recv_at ? recv_at
                         : static_cast<void*>(static_cast<char*>(s.grad_shard.data()) + static_cast<std::size_t>(mine_at) * esz);
    comm::CallOptions o;
    o.async = async;
    return z_.grads_.reduce_scatter_v(send, recv, counts, dtype, comm::ReduceOp::sum, o);
  }

  // parallel.grad_reduce_dtype = bf16: bucket b rounded into a [numel] staging copy, reduce-
  // scattered into a staging part [this rank's count], widened into grad_shard in complete().
  void scatter_range_staged(ZeroOptimizer::Shard& s, int b) {
    const GradBucket& k = bucket(b);
    Tensor send = Tensor::empty({k.numel}, *reduce_dtype_, *ctx_->allocator, "grad_reduce_stage");
    ops::cast(*ctx_, bucket_grads(b), send);
    const RankPart mine = rank_parts(s.counts, k.offset, k.numel)[static_cast<std::size_t>(z_.grads_.rank())];
    Tensor recv = Tensor::empty({std::max<std::int64_t>(mine.count, 1)}, *reduce_dtype_, *ctx_->allocator, "grad_reduce_stage");
    comm::Work w = scatter_into(s, send.data(), recv.data(), *reduce_dtype_, k.offset, k.numel, true);
    // send stays alive until the collective is waited (stream-ordered free after it).
    if (mine.count > 0)
      inflight_.add_staged(std::move(w), recv.flat_range(0, mine.count), s.grad_shard.flat_range(mine.at(), mine.count),
                           send);
    else
      inflight_.add(std::move(w), send);
  }

  // parallel.grad_exchange = copy-engine: bucket b's ranges owned by other ranks go to their
  // windows by peer copies on copy lane 0 (comm/peer_copy.h), each followed by a signal (flag b
  // = this round); this rank's range stays in the bucket until end_exchange().
  void put_bucket(int b) {
    const ZeroOptimizer::Shard& s = z_.shards_[0];
    const GradBucket& k = bucket(b);
    const auto esz = static_cast<std::int64_t>(dtype_size(s.grad_shard.dtype()));
    const char* src = static_cast<const char*>(bucket_source(b));
    const std::vector<RankPart> parts = rank_parts(s.counts, k.offset, k.numel);
    for (int q = 0; q < z_.grads_.size(); ++q) {
      const RankPart& p = parts[static_cast<std::size_t>(q)];
      if (q == z_.grads_.rank()) {
        if (p.count > 0) own_.push_back({b, p});
        continue;
      }
      if (p.count == 0) continue;   // rank q owns none of the bucket and waits for no signal of it
      exchange_->put(q, static_cast<std::size_t>(p.at() * esz), src + (p.begin - k.offset) * esz,
                     static_cast<std::size_t>(p.count * esz), ctx_->stream);
      exchange_->signal(q, b, round_, 0);
    }
  }
  // After the backward, on the compute stream: for each bucket, a device wait for the other
  // ranks' signals (no host wait or barrier), then grad_shard = every rank's copy of this rank's
  // part, added in rank order (parallel/rank_order_sum.h: NCCL's bits with 2 ranks; with more,
  // NCCL's ring adds in another order, within rounding). The sums run after the backward at full speed: summed during
  // it on a low-priority side stream they slowed the backward by as much as they took and were
  // not faster overall (docs/performance.md).
  void end_exchange() {
    NvtxRange r("grad_exchange_sum");
    ZeroOptimizer::Shard& s = z_.shards_[0];
    Context& ctx = *ctx_;
    const int me = z_.grads_.rank();
    for (const OwnPart& o : own_) {
      for (int q = 0; q < z_.grads_.size(); ++q)
        if (q != me) exchange_->wait(q, o.bucket, round_, ctx.stream);
      const GradBucket& k = bucket(o.bucket);
      const std::int64_t n = o.part.count;
      std::vector<Tensor> terms;
      for (int q = 0; q < z_.grads_.size(); ++q)
        terms.push_back(q == me ? bucket_grads(o.bucket).flat_range(o.part.begin - k.offset, n)
                                : Tensor::view(static_cast<char*>(exchange_->slot(q)) +
                                                   static_cast<std::size_t>(o.part.at()) * dtype_size(s.grad_shard.dtype()),
                                               {n}, s.grad_shard.dtype(), Device::cuda));
      Tensor out = s.grad_shard.flat_range(o.part.at(), n);
      sum_in_rank_order(ctx, terms, out, out);
    }
    own_.clear();
    // This rank's copies read the bucket buffers, released next; the next begin() waits for the
    // sums before any rank writes a window again.
    exchange_->drain(ctx.stream);
    exchange_->consumed(ctx.stream);
  }

  std::optional<DType> reduce_dtype_;   // none: reduce-scatter the gradients in their own dtype
  ZeroOptimizer& z_;
  model::ParameterStore* store_;
  Context* ctx_;
  std::unique_ptr<parallel::LazyGradients> lazy_;   // when the store has no flat gradients
  std::optional<BucketReducer> reducer_;             // zero2
  ReductionsInFlight inflight_;
  std::unique_ptr<comm::PeerCopyExchange> exchange_;   // parallel.grad_exchange = copy-engine
  std::uint64_t round_ = 0;                            // the exchange's signal value this step
  struct OwnPart {
    int bucket;
    RankPart part;   // this rank's part of the bucket
  };
  std::vector<OwnPart> own_;
};

ZeroOptimizer::ZeroOptimizer(ZeroMode mode, comm::Communicator& grads, comm::Communicator& host,
                             const OptimConfig& cfg)
    : mode_(mode), grads_(grads), host_(host), cfg_(cfg) {}

int ZeroOptimizer::add_group(const Group& g, Context& ctx) {
  // grads undefined: the group's gradients come from zero2's bucket buffers (a model store
  // without a flat gradient buffer).
  const bool bucketed_grads = !g.grads.defined() || g.grads.data() == nullptr;
  LMSCALE_CHECK(g.params.defined() || (offload_ && g.lowp && g.packed_reads.defined()),
                "a group without params needs an offloaded optimizer, a working copy and its packed master reads");
  LMSCALE_CHECK(bucketed_grads ? mode_ == ZeroMode::zero2 : g.numel() == g.grads.numel(),
                "group params {} vs grads {} (only zero2 takes a group without a gradient buffer)", g.numel(),
                g.grads.numel());
  Shard s;
  s.g = g;
  s.counts = even_split(g.numel(), grads_.size());
  for (int r = 0; r < grads_.rank(); ++r) s.begin += static_cast<std::int64_t>(s.counts[static_cast<std::size_t>(r)]);
  s.size = static_cast<std::int64_t>(s.counts[static_cast<std::size_t>(grads_.rank())]);
  if (mode_ != ZeroMode::zero1_broadcast)
    s.grad_shard = Tensor::empty({s.size}, g.params.defined() ? g.params.dtype() : DType::f32, *ctx.allocator,
                                 "gradient_shard");
  // This rank's part of the group's parameters (layer-wise optimizers: their norms are summed
  // over the ranks in step()).
  std::vector<optim::ParamSegment> mine;
  for (const auto& seg : g.segments) {
    const std::int64_t a = std::max(seg.offset, s.begin), b = std::min(seg.offset + seg.numel, s.begin + s.size);
    if (a < b) mine.push_back({a - s.begin, b - a, seg.param, seg.layerwise});
  }
  if (g.segments.empty() && s.size > 0) mine.push_back({0, s.size, 0, true});
  if (!offload_) s.opt = optim::make_optimizer(cfg_, s.size, g.params.dtype(), ctx, std::max(g.num_params, 1), std::move(mine));
  // Each rank's share of the master ranges the forward reads (gathered after each step with the copy).
  s.read_counts.assign(static_cast<std::size_t>(grads_.size()), 0);
  std::int64_t lo = 0;
  for (int q = 0; q < grads_.size(); ++q) {
    const std::int64_t hi = lo + static_cast<std::int64_t>(s.counts[static_cast<std::size_t>(q)]);
    for (const auto& [offset, numel] : g.master_reads)
      s.read_counts[static_cast<std::size_t>(q)] +=
          static_cast<std::size_t>(std::max<std::int64_t>(0, std::min(hi, offset + numel) - std::max(lo, offset)));
    lo = hi;
  }
  // A group added mid-training starts from rank 0's values everywhere (a group without params:
  // its working copy and packed master reads; every rank's host master holds the same values).
  if (s.g.params.defined()) {
    grads_.broadcast(s.g.params, 0);
    if (s.g.lowp) ops::cast(ctx, s.g.params, *s.g.lowp);
  } else {
    grads_.broadcast(*s.g.lowp, 0);
    grads_.broadcast(s.g.packed_reads, 0);
  }
  if (offload_) {
    s.offloaded = offload_(s.begin, s.begin + s.size);
    if (s.g.params.defined())   // the initial values (else `make` wrote them)
      ops::copy(ctx, s.g.params.flat_range(s.begin, s.size), s.offloaded->master());
    s.offloaded->mark_targets_current();   // the working copy and params above hold the same values
  }
  shards_.push_back(std::move(s));
  return static_cast<int>(shards_.size()) - 1;
}

void ZeroOptimizer::make_sync(DdpMode ddp, model::ParameterStore& store, double bucket_mb, Context& ctx,
                              std::optional<DType> reduce_dtype, bool copy_engine) {
  LMSCALE_CHECK(!copy_engine || mode_ == ZeroMode::zero2, "the copy-engine gradient exchange is built for zero2 only");
  LMSCALE_CHECK(!reduce_dtype || mode_ == ZeroMode::zero2,
                "a gradient reduce dtype other than fp32 is built for zero2 only");
  if (mode_ == ZeroMode::zero1_broadcast) {
    sync_ = std::make_unique<DataParallel>(ddp, grads_, host_, store, bucket_mb);
  } else if (mode_ == ZeroMode::zero1) {
    sync_ = std::make_unique<ReduceScatterSync>(*this, 0.0, nullptr, &ctx);
  } else {
    auto rs = std::make_unique<ReduceScatterSync>(*this, bucket_mb * 1024.0 * 1024.0, &store, &ctx);
    rs->set_reduce_dtype(reduce_dtype);
    if (copy_engine) rs->use_copy_engine();
    sync_ = std::move(rs);
  }
}

const Tensor& ZeroOptimizer::shard_grads(Shard& s) {
  if (mode_ == ZeroMode::zero1_broadcast) {
    s.grad_shard = s.g.grads.flat_range(s.begin, s.size);   // the all-reduced gradients, our range
  }
  return s.grad_shard;
}

double ZeroOptimizer::grad_sum_squares(Context& ctx) {
  double local = 0;
  for (auto& s : shards_) local += optim::sum_of_squares(ctx, shard_grads(s));
  return sync_->sum_scalar(local);
}

double ZeroOptimizer::grad_sum_squares_in(Context& ctx,
                                          const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  // Each rank sums the part of the ranges inside its shard of group 0; the parts add up over ranks.
  std::vector<Tensor> parts;
  if (!shards_.empty()) {
    Shard& s = shards_[0];
    const Tensor& g = shard_grads(s);
    for (const auto& [offset, numel] : ranges) {
      const std::int64_t a = std::max(offset, s.begin), b = std::min(offset + numel, s.begin + s.size);
      if (b > a) parts.push_back(g.flat_range(a - s.begin, b - a));
    }
  }
  const double local = parts.empty() ? 0.0 : optim::sum_of_squares(ctx, parts);
  return sync_->sum_scalar(local);
}

// zero1 and zero2 with a working copy: the optimizer wrote this rank's range of the copy; the copy
// is all-gathered and the master stays partial. Otherwise the master is exchanged and cast.
bool ZeroOptimizer::gathers_working_copy(const Shard& s) const {
  return s.g.lowp != nullptr && mode_ != ZeroMode::zero1_broadcast;
}

void ZeroOptimizer::distribute_parameters(Shard& s, Context& ctx) {
  NvtxRange r("zero_distribute_parameters");
  if (mode_ == ZeroMode::zero1_broadcast) {
    std::int64_t at = 0;
    for (int owner = 0; owner < grads_.size(); ++owner) {
      const auto n = static_cast<std::int64_t>(s.counts[static_cast<std::size_t>(owner)]);
      Tensor part = s.g.params.flat_range(at, n);
      if (n > 0) grads_.broadcast(part, owner).wait();
      at += n;
    }
    if (s.g.lowp) ops::cast(ctx, s.g.params, *s.g.lowp);
    return;
  }
  const Tensor& buf = gathers_working_copy(s) ? *s.g.lowp : s.g.params;
  // Deferred: the norm weights first (the compute stream waits for them; the collectives of one
  // communicator run in order), then the segments, left in flight: each range's ranks hold
  // consecutive pieces of it, so it is gathered in place like the whole buffer.
  const bool defer = !deferred_ranges_.empty() && &s == &shards_.front();
  if (!defer) gather_in_place(grads_, buf, s.counts);
  if (gathers_working_copy(s)) {
    gather_master_reads(s, ctx);
    s.master_partial = s.g.params.defined();   // (without params the master is the hosts', whole)
  }
  if (defer)
    for (const auto& [offset, n] : deferred_ranges_)
      in_flight_gathers_.push_back(gather_in_place(grads_, buf.flat_range(offset, n), counts_in(s.counts, offset, n), true));
}

void ZeroOptimizer::defer_gathers(std::vector<std::pair<std::int64_t, std::int64_t>> ranges) {
  LMSCALE_CHECK(mode_ != ZeroMode::zero1_broadcast, "deferred gathers: zero1 and zero2 only");
  LMSCALE_CHECK(shards_.size() == 1, "deferred gathers: one parameter group ({} here)", shards_.size());
  std::int64_t covered = 0;
  for (const auto& [offset, n] : ranges) {
    LMSCALE_CHECK(offset >= 0 && n >= 0 && offset + n <= shards_[0].g.numel(), "deferred gather range {}+{}", offset, n);
    covered += n;
  }
  LMSCALE_CHECK(ranges.empty() || covered == shards_[0].g.numel(),
                "deferred gathers cover {} of {} elements", covered, shards_[0].g.numel());
  deferred_ranges_ = std::move(ranges);
}

// The master ranges the forward reads (norm weights): packed in offset order into a staging
// buffer (the front of the gradient shard, dead after the step, when it is large enough), where
// each rank's elements form one contiguous slice; all-gathered; the other ranks' parts unpacked.
void ZeroOptimizer::gather_master_reads(Shard& s, Context& ctx) {
  if (!s.g.params.defined()) return gather_packed_reads(s);
  std::int64_t n = 0;
  for (const auto& range : s.g.master_reads) n += range.second;
  if (n == 0) return;
  Tensor staging = s.grad_shard.defined() && s.grad_shard.numel() >= n && s.grad_shard.dtype() == s.g.params.dtype()
                       ? s.grad_shard.flat_range(0, n)
                       : Tensor::empty({n}, s.g.params.dtype(), *ctx.allocator, "zero_master_reads");
  const std::int64_t b = s.begin, e = s.begin + s.size;
  // Pieces (master offset, staging offset, numel) of the ranges inside and outside [b, e).
  auto for_pieces = [&](bool own, auto&& f) {
    std::int64_t at = 0;   // staging offset of the range's first element
    for (const auto& [offset, numel] : s.g.master_reads) {
      const std::int64_t in_lo = std::max(b, offset), in_hi = std::min(e, offset + numel);
      if (own) {
        if (in_hi > in_lo) f(in_lo, at + in_lo - offset, in_hi - in_lo);
      } else if (in_hi <= in_lo) {
        f(offset, at, numel);
      } else {
        if (in_lo > offset) f(offset, at, in_lo - offset);
        if (offset + numel > in_hi) f(in_hi, at + in_hi - offset, offset + numel - in_hi);
      }
      at += numel;
    }
  };
  for_pieces(true, [&](std::int64_t m, std::int64_t st, std::int64_t k) {
    Tensor dst = staging.flat_range(st, k);
    ops::copy(ctx, s.g.params.flat_range(m, k), dst);
  });
  gather_in_place(grads_, staging, s.read_counts);
  for_pieces(false, [&](std::int64_t m, std::int64_t st, std::int64_t k) {
    Tensor dst = s.g.params.flat_range(m, k);
    ops::copy(ctx, staging.flat_range(st, k), dst);
  });
}

void ZeroOptimizer::complete_master(Context& ctx) {
  finish_unit_gathers(ctx);
  for (auto& s : shards_) {
    if (!s.master_partial) continue;
    NvtxRange r("zero_complete_master");
    if (s.offloaded) {   // the device master's range is stale but for the norm weights: the host's values
      s.offloaded->settle();
      Tensor dst = s.g.params.flat_range(s.begin, s.size);
      ops::copy(ctx, s.offloaded->master(), dst);
    }
    gather_in_place(grads_, s.g.params, s.counts);
    s.master_partial = false;
  }
}

void ZeroOptimizer::step(Context& ctx, double lr, double grad_scale) {
  NvtxRange r("zero_step");
  finish_unit_gathers(ctx);   // a step with no forward since the last (the gathers read the shard's copies)
  for (std::size_t gi = 0; gi < shards_.size(); ++gi) {
    Shard& s = shards_[gi];
    // This rank's range of the working copy, written by the update itself (gathered below).
    Tensor lowp = gathers_working_copy(s) ? s.g.lowp->flat_range(s.begin, s.size) : Tensor();
    if (s.offloaded) {
      // The host worker updates the shard chunk by chunk and copies each piece up (into the
      // working copy's range, and the master's for the norm weights and fp32 runs). Per unit
      // (gather_per_unit): the next forward gathers each unit once its update has landed
      // (zero_offload.cpp); else the all-gather below waits for all of it (the compute stream
      // waits for each unit's copies).
      s.offloaded->start_step(ctx, shard_grads(s), lr, grad_scale);
      if (gathers_per_unit()) {
        units_pending_ = true;
        units_issued_ = units_waited_ = 0;
        units_ctx_ = &ctx;
        continue;
      }
      for (int u = 0; u < s.offloaded->units(); ++u) s.offloaded->wait_unit(ctx, u);
      distribute_parameters(s, ctx);
      continue;
    }
    Tensor p = s.g.params.flat_range(s.begin, s.size);
    optim::Optimizer& opt = *s.opt;
    opt.begin_step();
    if (opt.layerwise()) {
      // Each rank's partial sums of squares of the parameter pieces in its range; one all-reduce
      // makes them the norms of the whole parameters (ranges cut parameters anywhere).
      std::vector<double> sums(opt.norm_slots(), 0.0), total(sums.size());
      if (s.size > 0) opt.accumulate_norms(ctx, p, shard_grads(s), 0, grad_scale, sums);
      host_.all_reduce(sums.data(), total.data(), sums.size(), DType::f64, comm::ReduceOp::sum).wait();
      if (gi == 0 && norm_reducer_) norm_reducer_(total);
      opt.set_norms(total);
    }
    if (s.size > 0) opt.step_range(ctx, p, shard_grads(s), lowp.defined() ? &lowp : nullptr, 0, lr, grad_scale);
    distribute_parameters(s, ctx);
  }
}

std::size_t ZeroOptimizer::state_bytes() const {
  std::size_t b = 0;
  for (const auto& s : shards_) b += optimizer_of(s).state_bytes();
  return b;
}

std::int64_t ZeroOptimizer::shard_begin(int g) const { return shards_[static_cast<std::size_t>(g)].begin; }
std::int64_t ZeroOptimizer::shard_size(int g) const { return shards_[static_cast<std::size_t>(g)].size; }
std::int64_t ZeroOptimizer::steps() const { return shards_.empty() ? 0 : optimizer_of(shards_[0]).steps(); }

}  // namespace lmscale::parallel
