#include "lmscale/parallel/copy_engine_all_reduce.h"

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/rank_order_sum.h"
#include "lmscale/parallel/state_layout.h"

namespace lmscale::parallel {

namespace {

// Elements of each rank's slot: its parts of every bucket, back to back (rank 0's are the largest).
std::int64_t slot_elements(const std::vector<parallel::GradBucket>& buckets, int ranks, int rank) {
  std::int64_t n = 0;
  for (const auto& k : buckets) {
    const auto [lo, hi] = slice_of(k.numel, rank, ranks);
    n += hi - lo;
  }
  return n;
}

// Flags per sender: "scattered" for bucket b at b, "gathered" at buckets + b.
int flag_count(const std::vector<parallel::GradBucket>& buckets) { return 2 * static_cast<int>(buckets.size()); }

}  // namespace

std::size_t CopyEngineAllReduce::window_bytes(const std::vector<parallel::GradBucket>& buckets, int ranks) {
  return comm::peer_copy_window_bytes(ranks, static_cast<std::size_t>(slot_elements(buckets, ranks, 0)) * 4,
                                      flag_count(buckets));
}

CopyEngineAllReduce::CopyEngineAllReduce(comm::Communicator& host, Tensor grads,
                                         std::vector<parallel::GradBucket> buckets, ops::Runtime& rt)
    : host_(host), grads_(std::move(grads)), buckets_(std::move(buckets)), rt_(rt), rank_(host.rank()),
      size_(host.size()) {
  LMSCALE_CHECK(grads_.dtype() == DType::f32 && grads_.device() == Device::cuda,
                "the copy-engine all-reduce sums fp32 gradients on CUDA");
  // Every rank's slot layout: its parts of the buckets, back to back in bucket order.
  slot_at_.assign(static_cast<std::size_t>(size_), {});
  for (int q = 0; q < size_; ++q) {
    std::int64_t at = 0;
    for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
      slot_at_[static_cast<std::size_t>(q)].push_back(at);
      at += part(b, q).count;
    }
  }
  exchange_ = comm::make_peer_copy_exchange(host_, static_cast<std::size_t>(slot_elements(buckets_, size_, 0)) * 4,
                                            &rt_.allocator().tracker(), flag_count(buckets_));
  grads_id_ = exchange_->share(grads_.data(), static_cast<std::size_t>(grads_.numel()) * 4);
}

CopyEngineAllReduce::Part CopyEngineAllReduce::part(int b, int q) const {
  const auto& k = buckets_[static_cast<std::size_t>(b)];
  const auto [lo, hi] = slice_of(k.numel, q, size_);   // even_split's q-th range (zero.h)
  return {k.offset + lo, hi - lo};
}

void CopyEngineAllReduce::begin_step() {
  ++round_;
  last_ = -1;
  waiting_.clear();
}

void CopyEngineAllReduce::launch(int b) {
  NvtxRange r("copy_engine_all_reduce");
  Context& ctx = rt_.ctx();
  char* g = static_cast<char*>(grads_.data());
  // 1. scatter: part q to rank q, after the backward's writes of the bucket.
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const Part p = part(b, q);
    exchange_->put(q, comm::PeerCopyExchange::kWindow, static_cast<std::size_t>(slot_at(q, b)) * 4, g + p.begin * 4,
                   static_cast<std::size_t>(p.count) * 4, ctx.stream, 0);
    exchange_->signal(q, b, round_, 0);
  }
  // 2.-3. for the bucket made ready kLag buckets ago, whose parts have long landed.
  waiting_.push_back(b);
  if (static_cast<int>(waiting_.size()) > kLag) {
    sum_and_gather(waiting_.front());
    waiting_.erase(waiting_.begin());
  }
  last_ = b;
}

void CopyEngineAllReduce::sum_and_gather(int b) {
  Context& ctx = rt_.ctx();
  const auto nb = static_cast<int>(buckets_.size());
  char* g = static_cast<char*>(grads_.data());
  // 2. sum this rank's part on the compute stream, once every other rank's copy of it has landed.
  for (int q = 0; q < size_; ++q)
    if (q != rank_) exchange_->wait(q, b, round_, ctx.stream);
  const Part mine = part(b, rank_);
  if (mine.count > 0) {
    Tensor own = grads_.flat_range(mine.begin, mine.count);
    std::vector<Tensor> terms;
    for (int q = 0; q < size_; ++q)
      terms.push_back(q == rank_ ? own
                                 : Tensor::view(static_cast<char*>(exchange_->slot(q)) +
                                                    static_cast<std::size_t>(slot_at(rank_, b)) * 4,
                                                {mine.count}, DType::f32, Device::cuda));
    // Partial sums (3 ranks or more) in the first other rank's slot, which they have just read.
    Tensor scratch = terms[rank_ == 0 ? 1 : 0];
    sum_in_rank_order(ctx, terms, own, scratch);
  }
  // 3. gather: the sum to every other rank's gradients, after the sum.
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    exchange_->put(q, grads_id_, static_cast<std::size_t>(mine.begin) * 4, g + mine.begin * 4,
                   static_cast<std::size_t>(mine.count) * 4, ctx.stream, 1);
    exchange_->signal(q, nb + b, round_, 1);
  }
}

void CopyEngineAllReduce::complete() {
  NvtxRange r("copy_engine_all_reduce_finish");
  Context& ctx = rt_.ctx();
  LMSCALE_CHECK(last_ >= 0, "copy-engine all-reduce: complete() without a bucket this round");
  for (int b : waiting_) sum_and_gather(b);
  waiting_.clear();
  const auto nb = static_cast<int>(buckets_.size());
  // Each rank's gather lane runs the buckets in the same order (the backward's): its flag for the
  // last one implies the others.
  for (int q = 0; q < size_; ++q)
    if (q != rank_) exchange_->wait(q, nb + last_, round_, ctx.stream);
  exchange_->drain(ctx.stream);
}

}  // namespace lmscale::parallel
