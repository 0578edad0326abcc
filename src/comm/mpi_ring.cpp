// algo=ring of the mpi backend: the textbook bandwidth-optimal ring over MPI_Sendrecv.
//
// All-reduce of `count` elements on p ranks = reduce-scatter + all-gather over p blocks, block i
// holding elements [count*i/p, count*(i+1)/p) (so any count works, also count < p: some blocks are
// empty). Reduce-scatter, step s = 0..p-2: rank r sends its running partial sum of block r-s-1 to
// rank r+1 and receives block r-s-2 from rank r-1, adding its own contribution; after p-1 steps it
// holds the full sum of block r. All-gather, step s: send block r-s, receive block r-s-1. Each rank
// sends 2(p-1)/p of the buffer in total, the lower bound that nccl-tests' busbw factor assumes.
// Partial sums of bf16/fp16 travel as fp32 (accumulate once, round once).
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "host_reduce.h"
#include "mpi_check.h"
#include "mpi_context.h"

namespace lmscale::comm::detail {

namespace {

constexpr int kRingTag = 1;
constexpr std::size_t kChainSegmentBytes = std::size_t{1} << 20;   // broadcast pipeline segment

struct Blocks {
  std::vector<std::size_t> off, cnt;
};

Blocks balanced_blocks(std::size_t count, int p) {
  Blocks b;
  for (int i = 0; i < p; ++i) {
    const std::size_t lo = count * static_cast<std::size_t>(i) / static_cast<std::size_t>(p);
    const std::size_t hi = count * static_cast<std::size_t>(i + 1) / static_cast<std::size_t>(p);
    b.off.push_back(lo);
    b.cnt.push_back(hi - lo);
  }
  return b;
}

Blocks request_blocks(const Request& req, int p) {
  Blocks b;
  for (int i = 0; i < p; ++i) {
    b.off.push_back(req.block_offset(i));
    b.cnt.push_back(req.block_count(i));
  }
  return b;
}

int wrap(int x, int p) { return ((x % p) + p) % p; }

// Rank r ends with block r of (op over ranks of send), finished (avg divided) into `out`.
void ring_reduce_scatter(MpiContext& ctx, const void* send, void* out, const Blocks& b, DType t, ReduceOp op) {
  const int p = ctx.size, r = ctx.rank;
  const DType acc_t = accumulation_dtype(t);
  const std::size_t es = dtype_size(t), as = dtype_size(acc_t);
  const std::size_t max_cnt = *std::max_element(b.cnt.begin(), b.cnt.end());
  char* a = static_cast<char*>(ctx.scratch_a.get(std::max<std::size_t>(max_cnt * as, 1)));
  char* c = static_cast<char*>(ctx.scratch_b.get(std::max<std::size_t>(max_cnt * as, 1)));
  auto own = [&](int i) { return static_cast<const char*>(send) + b.off[static_cast<std::size_t>(i)] * es; };
  auto cnt = [&](int i) { return b.cnt[static_cast<std::size_t>(i)]; };
  const MPI_Datatype acc_type = mpi_datatype(acc_t);
  const int right = wrap(r + 1, p), left = wrap(r - 1, p);

  widen(t, own(wrap(r - 1, p)), acc_t, a, cnt(wrap(r - 1, p)));   // p == 1: this is block 0 = r
  for (int s = 0; s < p - 1; ++s) {
    const int si = wrap(r - s - 1, p), ri = wrap(r - s - 2, p);
    LMSCALE_MPI_CHECK(MPI_Sendrecv(a, mpi_count(cnt(si), "ring"), acc_type, right, kRingTag, c,
                                   mpi_count(cnt(ri), "ring"), acc_type, left, kRingTag, ctx.ring, MPI_STATUS_IGNORE),
                      ctx.rank);
    accumulate(acc_t, c, t, own(ri), op, cnt(ri));
    std::swap(a, c);
  }
  finish(acc_t, a, t, out, op, p, cnt(r));
}

// Every rank holds its own block r of `buf`; afterwards all blocks.
void ring_all_gather(MpiContext& ctx, void* buf, const Blocks& b, DType t) {
  const int p = ctx.size, r = ctx.rank;
  const std::size_t es = dtype_size(t);
  const MPI_Datatype type = mpi_datatype(t);
  const int right = wrap(r + 1, p), left = wrap(r - 1, p);
  auto at = [&](int i) { return static_cast<char*>(buf) + b.off[static_cast<std::size_t>(i)] * es; };
  for (int s = 0; s < p - 1; ++s) {
    const int si = wrap(r - s, p), ri = wrap(r - s - 1, p);
    LMSCALE_MPI_CHECK(MPI_Sendrecv(at(si), mpi_count(b.cnt[static_cast<std::size_t>(si)], "ring"), type, right,
                                   kRingTag, at(ri), mpi_count(b.cnt[static_cast<std::size_t>(ri)], "ring"), type,
                                   left, kRingTag, ctx.ring, MPI_STATUS_IGNORE),
                      ctx.rank);
  }
}

// A pipelined chain root -> root+1 -> ... in segments: each rank forwards segment k while it
// receives segment k+1.
void chain_broadcast(MpiContext& ctx, void* buf, std::size_t count, DType t, int root) {
  const int p = ctx.size, pos = wrap(ctx.rank - root, p);
  const int right = wrap(ctx.rank + 1, p), left = wrap(ctx.rank - 1, p);
  const std::size_t es = dtype_size(t);
  const std::size_t seg = std::max<std::size_t>(1, kChainSegmentBytes / es);
  const MPI_Datatype type = mpi_datatype(t);
  MPI_Request pending = MPI_REQUEST_NULL;
  for (std::size_t off = 0; off < count; off += seg) {
    char* at = static_cast<char*>(buf) + off * es;
    const int k = mpi_count(std::min(seg, count - off), "ring broadcast");
    if (pos > 0) LMSCALE_MPI_CHECK(MPI_Recv(at, k, type, left, kRingTag, ctx.ring, MPI_STATUS_IGNORE), ctx.rank);
    if (pos < p - 1) {
      LMSCALE_MPI_CHECK(MPI_Wait(&pending, MPI_STATUS_IGNORE), ctx.rank);
      LMSCALE_MPI_CHECK(MPI_Isend(at, k, type, right, kRingTag, ctx.ring, &pending), ctx.rank);
    }
  }
  LMSCALE_MPI_CHECK(MPI_Wait(&pending, MPI_STATUS_IGNORE), ctx.rank);
}

}  // namespace

void run_ring(MpiContext& ctx, const Request& req) {
  const std::size_t es = dtype_size(req.dtype);
  switch (req.kind) {
    case OpKind::all_reduce: {
      if (req.count == 0) return;
      const Blocks b = balanced_blocks(req.count, ctx.size);
      void* mine = static_cast<char*>(req.recv) + b.off[static_cast<std::size_t>(ctx.rank)] * es;
      ring_reduce_scatter(ctx, req.send, mine, b, req.dtype, req.op);
      ring_all_gather(ctx, req.recv, b, req.dtype);
      return;
    }
    case OpKind::reduce_scatter: {
      if (req.total_count(ctx.size) == 0) return;
      ring_reduce_scatter(ctx, req.send, req.recv, request_blocks(req, ctx.size), req.dtype, req.op);
      return;
    }
    case OpKind::all_gather: {
      if (req.total_count(ctx.size) == 0) return;
      const Blocks b = request_blocks(req, ctx.size);
      char* mine = static_cast<char*>(req.recv) + b.off[static_cast<std::size_t>(ctx.rank)] * es;
      if (mine != req.send) std::memcpy(mine, req.send, b.cnt[static_cast<std::size_t>(ctx.rank)] * es);
      ring_all_gather(ctx, req.recv, b, req.dtype);
      return;
    }
    case OpKind::broadcast:
      chain_broadcast(ctx, req.recv, req.count, req.dtype, req.peer);
      return;
    default:
      throw Error(fmt::format("ring algorithm: unexpected {}", op_kind_name(req.kind)));
  }
}

}  // namespace lmscale::comm::detail
