// Expert parallelism's row all-to-all over the copy engines (parallel/copy_engine_all_to_all.h).
#include "lmscale/parallel/copy_engine_all_to_all.h"

#include <algorithm>
#include <numeric>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"

namespace lmscale::parallel {

namespace {

constexpr int kLane = 0;   // the copy lane of every put (one lane: each pair's chunks stay in order)

const comm::PeerCopyUser kUser{"parallel.ep_exchange", "expert-parallel", CopyEngineAllToAll::kTag};

// Where each rank's block starts (rows): the prefix sums of `rows`.
std::vector<std::int64_t> starts(const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> at(rows.size(), 0);
  for (std::size_t r = 1; r < rows.size(); ++r) at[r] = at[r - 1] + rows[r - 1];
  return at;
}

std::int64_t total(const std::vector<std::int64_t>& rows) {
  return std::accumulate(rows.begin(), rows.end(), std::int64_t{0});
}

}  // namespace

std::int64_t CopyEngineAllToAll::slot_rows(const model::ModelDims& dims, std::int64_t sequences) {
  const std::int64_t T = dims.context, tokens = sequences * T;
  std::int64_t rows = tokens * dims.moe_top_k;   // dropless: every assignment of the micro-batch's tokens
  if (dims.moe_capacity_factor > 0)
    rows = std::min(rows, sequences * dims.moe_experts * dims.expert_capacity(T));   // kept per expert and sequence
  return std::max<std::int64_t>(1, rows);
}

std::size_t CopyEngineAllToAll::slot_bytes(const model::ModelDims& dims, std::int64_t sequences,
                                           std::size_t element_bytes) {
  return static_cast<std::size_t>(slot_rows(dims, sequences)) * static_cast<std::size_t>(dims.d_model) *
         element_bytes;
}

CopyEngineAllToAll::CopyEngineAllToAll(comm::Communicator& host, std::size_t slot_bytes, ops::Runtime& rt)
    : rt_(rt), rank_(host.rank()), size_(host.size()), slot_bytes_(slot_bytes) {
  LMSCALE_CHECK(rt_.ctx().device == Device::cuda, "parallel.ep_exchange = copy-engine runs on CUDA devices");
  exchange_ = comm::make_peer_copy_exchange(host, slot_bytes_, &rt_.allocator().tracker(), kFlags, kUser);
  put_.assign(static_cast<std::size_t>(size_), 0);
  read_.assign(static_cast<std::size_t>(size_), 0);
}

CopyEngineAllToAll::~CopyEngineAllToAll() {
  if (unwinding() || !exchange_) return;
  // The peers' kRead signals of this rank's last chunks are written into this rank's window: they
  // must have landed before the window is freed (the exchange's destructor waits for the lane).
  for (int j = 0; j < size_; ++j)
    if (j != rank_ && put_[static_cast<std::size_t>(j)] > 0)
      exchange_->lane_wait(j, kRead, put_[static_cast<std::size_t>(j)], kLane);
}

void CopyEngineAllToAll::rows(const Tensor& send, const std::vector<std::int64_t>& send_rows, Tensor& recv,
                              const std::vector<std::int64_t>& recv_rows) {
  NvtxRange range("ep_all_to_all_copy_engine");
  Context& ctx = rt_.ctx();
  const auto n_ranks = static_cast<std::size_t>(size_);
  LMSCALE_CHECK(send_rows.size() == n_ranks && recv_rows.size() == n_ranks,
                "copy-engine all-to-all: {} send and {} receive counts for {} ranks", send_rows.size(),
                recv_rows.size(), size_);
  LMSCALE_CHECK(send.dtype() == recv.dtype() && send.device() == Device::cuda && recv.device() == Device::cuda,
                "copy-engine all-to-all: send and recv must be CUDA tensors of one dtype");
  const std::int64_t send_total = total(send_rows), recv_total = total(recv_rows);
  // Row width d: from whichever side has rows (a rank may send or receive none).
  const std::int64_t width = send.numel() > 0   ? send.numel() / send.dim(0)
                             : recv.numel() > 0 ? recv.numel() / recv.dim(0)
                                                : 0;
  LMSCALE_CHECK(send.numel() == send_total * width && recv.numel() == recv_total * width,
                "copy-engine all-to-all: send holds {} elements for {} rows, recv {} for {} rows (width {})",
                send.numel(), send_total, recv.numel(), recv_total, width);
  const std::size_t me = static_cast<std::size_t>(rank_);
  LMSCALE_CHECK(send_rows[me] == recv_rows[me], "copy-engine all-to-all: rank {} sends itself {} rows but receives {}",
                rank_, send_rows[me], recv_rows[me]);
  if (width == 0) return;   // no rows anywhere for this rank: no peer has a chunk for it either
  const std::size_t row_bytes = static_cast<std::size_t>(width) * dtype_size(send.dtype());
  // The rows one chunk carries. Every rank computes the same (the same window, width and dtype),
  // so both sides of a pair split its rows into the same chunks.
  const auto chunk = static_cast<std::int64_t>(slot_bytes_ / row_bytes);
  LMSCALE_CHECK(chunk >= 1,
                "parallel.ep_exchange = copy-engine: a row of {} bytes does not fit the {}-byte slot of the receive "
                "window (sized for the compute dtype's rows of d_model elements: CopyEngineAllToAll::slot_bytes)",
                row_bytes, slot_bytes_);
  const std::vector<std::int64_t> send_at = starts(send_rows), recv_at = starts(recv_rows);
  auto chunks = [chunk](std::int64_t rows) { return (rows + chunk - 1) / chunk; };
  std::int64_t rounds = 0;
  for (std::size_t j = 0; j < n_ranks; ++j)
    if (j != me) rounds = std::max({rounds, chunks(send_rows[j]), chunks(recv_rows[j])});
  const char* src = static_cast<const char*>(send.data());
  // This rank's own rows: a device-to-device copy on the compute stream.
  auto copy_own = [&] {
    if (send_rows[me] == 0) return;
    Tensor own = recv.slice(recv_at[me], recv_at[me] + recv_rows[me]);
    ops::copy(ctx, send.slice(send_at[me], send_at[me] + send_rows[me]), own);
  };
  bool lane_ordered = false;   // lane 0 waits for the compute stream's writes of `send` (once per call)
  for (std::int64_t n = 0; n < rounds; ++n) {
    const std::int64_t first = n * chunk;
    // 1. The n-th chunk of the rows for each peer into its slot, once the peer has read the last.
    for (std::size_t j = 0; j < n_ranks; ++j) {
      if (j == me || first >= send_rows[j]) continue;
      const std::int64_t rows = std::min(chunk, send_rows[j] - first);
      const int to = static_cast<int>(j);
      if (put_[j] > 0) exchange_->lane_wait(to, kRead, put_[j], kLane);
      exchange_->put(to, comm::PeerCopyExchange::kWindow, 0,
                     src + static_cast<std::size_t>(send_at[j] + first) * row_bytes,
                     static_cast<std::size_t>(rows) * row_bytes, lane_ordered ? nullptr : ctx.stream, kLane);
      lane_ordered = true;
      exchange_->signal(to, kPut, ++put_[j], kLane);
    }
    if (n == 0) copy_own();   // while the peers' first chunks are in flight
    // 2. Each peer's n-th chunk out of its slot, then "read" back to it.
    for (std::size_t j = 0; j < n_ranks; ++j) {
      if (j == me || first >= recv_rows[j]) continue;
      const std::int64_t rows = std::min(chunk, recv_rows[j] - first);
      const int from = static_cast<int>(j);
      exchange_->wait(from, kPut, ++read_[j], ctx.stream);
      const Tensor slot = Tensor::view(exchange_->slot(from), {rows, width}, send.dtype(), Device::cuda);
      Tensor dst = recv.slice(recv_at[j] + first, recv_at[j] + first + rows);
      ops::copy(ctx, slot, dst);
      exchange_->signal_after(from, kRead, read_[j], ctx.stream);
    }
  }
  if (rounds == 0) copy_own();   // no peer has rows for this rank, nor this rank for a peer
  // The caller may free or overwrite `send` once this returns: the compute stream waits for the
  // lane's reads of it.
  if (lane_ordered) exchange_->drain(ctx.stream);
}

}  // namespace lmscale::parallel
