// algo=shm of the mpi backend: collectives through a node-local shared-memory window
// (shm_segment.h), with copies and reductions split over a few threads per rank, so a rank is not
// limited by what one core can copy. Messages go in chunks of the staging buffer size.
//
// All-reduce, per chunk of m elements split into p slices (slice q = [m*q/p, m*(q+1)/p)):
//   1. each rank copies the slices of its input that other ranks reduce into its own staging buffer
//   2. sync
//   3. rank r reduces slice r over all ranks, in rank order, reading its own input in place and the
//      others' staging buffers; writes the result to its output and to its staging buffer
//   4. sync
//   5. each rank copies the other ranks' result slices out of their staging buffers
// so per rank ~4x the chunk crosses memory (vs. 2(p-1)/p x 2 messages for a ring, each copied
// twice by MPI's shared-memory transport). bf16/fp16 are summed in fp32 registers, rounded once.
// Reduce-scatter is steps 1-3 (rank r reduces its block); all-gather and broadcast are
// copy-in, sync, copy-out.
#include <algorithm>
#include <cstring>
#include <vector>

#include "host_reduce.h"
#include "lmscale/core/error.h"
#include "mpi_context.h"

namespace lmscale::comm::detail {

namespace {

constexpr std::size_t kMinParallelBytes = std::size_t{256} << 10;   // below: one thread
constexpr std::size_t kMinTaskBytes = std::size_t{64} << 10;

struct Piece {
  char* dst;
  const char* src;
  std::size_t bytes;
};

int useful_threads(MpiContext& ctx, std::size_t bytes) {
  if (bytes < kMinParallelBytes) return 1;
  return ctx.thread_pool().threads();
}

void parallel_copy(MpiContext& ctx, const std::vector<Piece>& pieces) {
  std::size_t total = 0;
  for (const auto& p : pieces) total += p.bytes;
  const int threads = useful_threads(ctx, total);
  if (threads == 1) {
    for (const auto& p : pieces)
      if (p.bytes && p.dst != p.src) std::memcpy(p.dst, p.src, p.bytes);
    return;
  }
  const std::size_t task = std::max(kMinTaskBytes, (total + 2 * threads - 1) / (2 * threads));
  std::vector<Piece> tasks;
  for (const auto& p : pieces) {
    if (p.dst == p.src) continue;
    for (std::size_t off = 0; off < p.bytes; off += task)
      tasks.push_back(Piece{p.dst + off, p.src + off, std::min(task, p.bytes - off)});
  }
  ctx.thread_pool().run(static_cast<int>(tasks.size()), [&](int i) {
    const Piece& t = tasks[static_cast<std::size_t>(i)];
    std::memcpy(t.dst, t.src, t.bytes);
  });
}

// out[i] (and out2[i]) = reduction over the m inputs, i < n, split over the pool's threads.
void parallel_reduce(MpiContext& ctx, DType t, ReduceOp op, char* out, char* out2, const std::vector<const char*>& in,
                     std::size_t n) {
  const std::size_t es = dtype_size(t);
  const int m = static_cast<int>(in.size());
  const int threads = useful_threads(ctx, n * es * static_cast<std::size_t>(m));
  if (threads == 1) {
    reduce_into(t, op, ctx.size, out, out2, reinterpret_cast<const void* const*>(in.data()), m, n);
    return;
  }
  const int tasks = 2 * threads;
  ctx.thread_pool().run(tasks, [&](int k) {
    const std::size_t lo = n * static_cast<std::size_t>(k) / static_cast<std::size_t>(tasks);
    const std::size_t hi = n * static_cast<std::size_t>(k + 1) / static_cast<std::size_t>(tasks);
    if (hi == lo) return;
    std::vector<const void*> part(in.size());
    for (std::size_t q = 0; q < in.size(); ++q) part[q] = in[q] + lo * es;
    reduce_into(t, op, ctx.size, out + lo * es, out2 ? out2 + lo * es : nullptr, part.data(), m, hi - lo);
  });
}

void shm_all_reduce(MpiContext& ctx, const Request& req) {
  ShmSegment& seg = ctx.shm_segment();
  const int p = ctx.size, me = ctx.rank;
  const std::size_t es = dtype_size(req.dtype), chunk = seg.buffer_bytes() / es;
  const char* send = static_cast<const char*>(req.send);
  char* recv = static_cast<char*>(req.recv);
  std::vector<Piece> pieces;
  std::vector<const char*> in(static_cast<std::size_t>(p));
  for (std::size_t e0 = 0; e0 < req.count; e0 += chunk) {
    const std::size_t m = std::min(chunk, req.count - e0);
    const int w = seg.next_buffer();
    auto lo = [&](int q) { return m * static_cast<std::size_t>(q) / static_cast<std::size_t>(p); };
    pieces.clear();
    for (int q = 0; q < p; ++q)
      if (q != me) pieces.push_back(Piece{seg.slot(me, w) + lo(q) * es, send + (e0 + lo(q)) * es, (lo(q + 1) - lo(q)) * es});
    parallel_copy(ctx, pieces);
    seg.sync();
    for (int q = 0; q < p; ++q)
      in[static_cast<std::size_t>(q)] = q == me ? send + (e0 + lo(me)) * es : seg.slot(q, w) + lo(me) * es;
    parallel_reduce(ctx, req.dtype, req.op, recv + (e0 + lo(me)) * es, seg.slot(me, w) + lo(me) * es, in,
                    lo(me + 1) - lo(me));
    seg.sync();
    pieces.clear();
    for (int q = 0; q < p; ++q)
      if (q != me) pieces.push_back(Piece{recv + (e0 + lo(q)) * es, seg.slot(q, w) + lo(q) * es, (lo(q + 1) - lo(q)) * es});
    parallel_copy(ctx, pieces);
  }
}

void shm_reduce_scatter(MpiContext& ctx, const Request& req) {
  ShmSegment& seg = ctx.shm_segment();
  const int p = ctx.size, me = ctx.rank;
  const std::size_t es = dtype_size(req.dtype);
  const std::size_t k = seg.buffer_bytes() / es / static_cast<std::size_t>(p);   // elements per rank per chunk
  LMSCALE_CHECK(k > 0, "shm staging buffer of {} bytes is too small for {} ranks", seg.buffer_bytes(), p);
  std::size_t max_cnt = 0;
  for (int q = 0; q < p; ++q) max_cnt = std::max(max_cnt, req.block_count(q));
  const char* send = static_cast<const char*>(req.send);
  char* recv = static_cast<char*>(req.recv);
  std::vector<Piece> pieces;
  std::vector<const char*> in(static_cast<std::size_t>(p));
  for (std::size_t e0 = 0; e0 < max_cnt; e0 += k) {
    const int w = seg.next_buffer();
    auto len = [&](int q) { return std::min(k, req.block_count(q) - std::min(e0, req.block_count(q))); };
    pieces.clear();
    for (int q = 0; q < p; ++q)
      if (q != me)
        pieces.push_back(Piece{seg.slot(me, w) + static_cast<std::size_t>(q) * k * es,
                               send + (req.block_offset(q) + e0) * es, len(q) * es});
    parallel_copy(ctx, pieces);
    seg.sync();
    if (len(me) == 0) continue;
    for (int q = 0; q < p; ++q)
      in[static_cast<std::size_t>(q)] = q == me ? send + (req.block_offset(me) + e0) * es
                                                : seg.slot(q, w) + static_cast<std::size_t>(me) * k * es;
    parallel_reduce(ctx, req.dtype, req.op, recv + e0 * es, nullptr, in, len(me));
  }
}

void shm_all_gather(MpiContext& ctx, const Request& req) {
  ShmSegment& seg = ctx.shm_segment();
  const int p = ctx.size, me = ctx.rank;
  const std::size_t es = dtype_size(req.dtype), k = seg.buffer_bytes() / es;
  std::size_t max_cnt = 0;
  for (int q = 0; q < p; ++q) max_cnt = std::max(max_cnt, req.block_count(q));
  const char* send = static_cast<const char*>(req.send);
  char* recv = static_cast<char*>(req.recv);
  std::vector<Piece> pieces;
  for (std::size_t e0 = 0; e0 < max_cnt; e0 += k) {
    const int w = seg.next_buffer();
    auto len = [&](int q) { return std::min(k, req.block_count(q) - std::min(e0, req.block_count(q))); };
    pieces.clear();
    pieces.push_back(Piece{seg.slot(me, w), send + e0 * es, len(me) * es});
    pieces.push_back(Piece{recv + (req.block_offset(me) + e0) * es, send + e0 * es, len(me) * es});   // no-op in place
    parallel_copy(ctx, pieces);
    seg.sync();
    pieces.clear();
    for (int q = 0; q < p; ++q)
      if (q != me) pieces.push_back(Piece{recv + (req.block_offset(q) + e0) * es, seg.slot(q, w), len(q) * es});
    parallel_copy(ctx, pieces);
  }
}

void shm_broadcast(MpiContext& ctx, const Request& req) {
  ShmSegment& seg = ctx.shm_segment();
  const int root = req.peer;
  const std::size_t es = dtype_size(req.dtype), k = seg.buffer_bytes() / es;
  char* buf = static_cast<char*>(req.recv);
  for (std::size_t e0 = 0; e0 < req.count; e0 += k) {
    const std::size_t m = std::min(k, req.count - e0);
    const int w = seg.next_buffer();
    if (ctx.rank == root) parallel_copy(ctx, {Piece{seg.slot(root, w), buf + e0 * es, m * es}});
    seg.sync();
    if (ctx.rank != root) parallel_copy(ctx, {Piece{buf + e0 * es, seg.slot(root, w), m * es}});
  }
}

}  // namespace

void run_shm(MpiContext& ctx, const Request& req) {
  switch (req.kind) {
    case OpKind::all_reduce: shm_all_reduce(ctx, req); return;
    case OpKind::reduce_scatter: shm_reduce_scatter(ctx, req); return;
    case OpKind::all_gather: shm_all_gather(ctx, req); return;
    case OpKind::broadcast: shm_broadcast(ctx, req); return;
    default: throw Error(fmt::format("shm algorithm: unexpected {}", op_kind_name(req.kind)));
  }
}

}  // namespace lmscale::comm::detail
