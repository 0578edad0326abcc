// algo=library of the mpi backend: MPI's own collectives. bf16/fp16 reductions go through fp32
// scratch buffers (widen, reduce in fp32, round once), since MPI has no 16-bit float types and a
// user-defined MPI_Op would round at every step of MPI's reduction tree.
#include <algorithm>
#include <cstring>
#include <vector>

#include "host_reduce.h"
#include "mpi_check.h"
#include "mpi_context.h"

namespace lmscale::comm::detail {

namespace {

constexpr std::size_t kMaxPiece = std::size_t{1} << 30;   // elements per MPI call

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

std::vector<int> int_counts(const Request& req, int size, const char* what) {
  std::vector<int> c(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) c[static_cast<std::size_t>(r)] = mpi_count(req.block_count(r), what);
  return c;
}

std::vector<int> int_displs(const Request& req, int size, const char* what) {
  std::vector<int> d(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) d[static_cast<std::size_t>(r)] = mpi_count(req.block_offset(r), what);
  return d;
}

// MPI_Allreduce in pieces of at most kMaxPiece elements (MPI counts are ints).
void allreduce_pieces(MpiContext& ctx, const void* send, void* recv, std::size_t n, MPI_Datatype type,
                      std::size_t es, MPI_Op op) {
  for (std::size_t off = 0; off < n; off += kMaxPiece) {
    const int k = static_cast<int>(std::min(kMaxPiece, n - off));
    char* r = static_cast<char*>(recv) + off * es;
    const void* s = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + off * es;
    LMSCALE_MPI_CHECK(MPI_Allreduce(s, r, k, type, op, ctx.comm), ctx.rank);
  }
}

void all_reduce(MpiContext& ctx, const Request& req) {
  const std::size_t n = req.count;
  if (n == 0) return;
  if (is_16bit(req.dtype)) {
    auto* acc = static_cast<float*>(ctx.scratch_a.get(n * sizeof(float)));
    widen(req.dtype, req.send, DType::f32, acc, n);
    allreduce_pieces(ctx, acc, acc, n, MPI_FLOAT, sizeof(float), mpi_op(req.op));
    finish(DType::f32, acc, req.dtype, req.recv, req.op, ctx.size, n);
    return;
  }
  allreduce_pieces(ctx, req.send, req.recv, n, mpi_datatype(req.dtype), dtype_size(req.dtype), mpi_op(req.op));
  if (req.op == ReduceOp::avg) finish(req.dtype, req.recv, req.dtype, req.recv, req.op, ctx.size, n);
}

void reduce_scatter(MpiContext& ctx, const Request& req) {
  const std::size_t total = req.total_count(ctx.size), mine = req.block_count(ctx.rank);
  const std::size_t es = dtype_size(req.dtype);
  const auto counts = int_counts(req, ctx.size, "reduce-scatter");
  if (total == 0) return;
  if (is_16bit(req.dtype)) {
    // In place on the fp32 copy: the result lands at its start.
    auto* acc = static_cast<float*>(ctx.scratch_a.get(total * sizeof(float)));
    widen(req.dtype, req.send, DType::f32, acc, total);
    LMSCALE_MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, acc, counts.data(), MPI_FLOAT, mpi_op(req.op), ctx.comm),
                      ctx.rank);
    finish(DType::f32, acc, req.dtype, req.recv, req.op, ctx.size, mine);
    return;
  }
  const MPI_Datatype type = mpi_datatype(req.dtype);
  const bool in_place = req.recv == static_cast<const char*>(req.send) + req.block_offset(ctx.rank) * es;
  if (in_place) {
    // MPI's in-place form reads the whole buffer and leaves the result at its start.
    void* buf = const_cast<void*>(req.send);
    LMSCALE_MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts.data(), type, mpi_op(req.op), ctx.comm), ctx.rank);
    if (buf != req.recv) std::memmove(req.recv, buf, mine * es);
  } else {
    LMSCALE_MPI_CHECK(MPI_Reduce_scatter(req.send, req.recv, counts.data(), type, mpi_op(req.op), ctx.comm), ctx.rank);
  }
  if (req.op == ReduceOp::avg) finish(req.dtype, req.recv, req.dtype, req.recv, req.op, ctx.size, mine);
}

void all_gather(MpiContext& ctx, const Request& req) {
  const std::size_t es = dtype_size(req.dtype);
  if (req.total_count(ctx.size) == 0) return;
  const MPI_Datatype type = mpi_datatype(req.dtype);
  const bool in_place = req.send == static_cast<const char*>(req.recv) + req.block_offset(ctx.rank) * es;
  const void* send = in_place ? MPI_IN_PLACE : req.send;
  if (!req.uneven()) {
    const int c = mpi_count(req.count, "all-gather");
    mpi_count(req.total_count(ctx.size), "all-gather");
    LMSCALE_MPI_CHECK(MPI_Allgather(send, c, type, req.recv, c, type, ctx.comm), ctx.rank);
    return;
  }
  const auto counts = int_counts(req, ctx.size, "all-gather");
  const auto displs = int_displs(req, ctx.size, "all-gather");
  mpi_count(req.total_count(ctx.size), "all-gather");
  LMSCALE_MPI_CHECK(MPI_Allgatherv(send, counts[static_cast<std::size_t>(ctx.rank)], type, req.recv, counts.data(),
                                   displs.data(), type, ctx.comm),
                    ctx.rank);
}

void broadcast(MpiContext& ctx, const Request& req) {
  const std::size_t es = dtype_size(req.dtype);
  const MPI_Datatype type = mpi_datatype(req.dtype);
  for (std::size_t off = 0; off < req.count; off += kMaxPiece) {
    const int k = static_cast<int>(std::min(kMaxPiece, req.count - off));
    LMSCALE_MPI_CHECK(MPI_Bcast(static_cast<char*>(req.recv) + off * es, k, type, req.peer, ctx.comm), ctx.rank);
  }
}

// MPI_Alltoallv with int counts and displacements (the even form as equal blocks).
void all_to_all(MpiContext& ctx, const Request& req) {
  const std::size_t n = static_cast<std::size_t>(ctx.size);
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  for (int r = 0; r < ctx.size; ++r) {
    const auto i = static_cast<std::size_t>(r);
    sc[i] = mpi_count(req.block_count(r), "all-to-all");
    sd[i] = mpi_count(req.block_offset(r), "all-to-all");
    rc[i] = mpi_count(req.recv_block_count(r), "all-to-all");
    rd[i] = mpi_count(req.recv_block_offset(r), "all-to-all");
  }
  mpi_count(req.total_count(ctx.size), "all-to-all");
  mpi_count(req.recv_total_count(ctx.size), "all-to-all");
  const MPI_Datatype type = mpi_datatype(req.dtype);
  LMSCALE_MPI_CHECK(MPI_Alltoallv(req.send, sc.data(), sd.data(), type, req.recv, rc.data(), rd.data(), type, ctx.comm),
                    ctx.rank);
}

}  // namespace

void run_library(MpiContext& ctx, const Request& req) {
  switch (req.kind) {
    case OpKind::all_reduce: all_reduce(ctx, req); return;
    case OpKind::reduce_scatter: reduce_scatter(ctx, req); return;
    case OpKind::all_gather: all_gather(ctx, req); return;
    case OpKind::broadcast: broadcast(ctx, req); return;
    case OpKind::all_to_all: all_to_all(ctx, req); return;
    default: throw Error(fmt::format("library algorithm: unexpected {}", op_kind_name(req.kind)));
  }
}

}  // namespace lmscale::comm::detail
