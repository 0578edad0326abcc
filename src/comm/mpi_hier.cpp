// algo=hier of the mpi backend: an all-reduce over ranks on several nodes that keeps the bulk of the
// traffic in shared memory and sends one copy of the message per node over the network:
//   1. node:    shm all-reduce among the ranks of this node (mpi_shm.cpp), result in recv
//   2. leaders: the library's all-reduce of that partial sum between the lowest rank of every node
//               (MPI_Allreduce over TCP/IB: the only step that crosses the network)
//   3. node:    shm broadcast of the leader's result to the other ranks of its node
// Why: with N nodes of k ranks, only one rank per node talks to the network, so each node sends
// what an N-rank all-reduce sends (~2x the message for a ring), in 2(N-1) network steps. Flat
// algorithms in which every rank exchanges with ranks on other nodes (recursive doubling and
// halving, Open MPI's usual choice below its ring threshold) send up to k times that per node;
// a flat ring ordered node by node sends about the same bytes but in 2(Nk-1) latency-bound steps.
// The two-level idea of Horovod's hierarchical all-reduce and of NCCL's trees.
//
// Numerics: sum and max go through the steps as they are; avg is a sum followed by one division
// by the group size. bf16/fp16 are widened to fp32 first and rounded once at the end, the same
// rule as library and shm (docs/collectives.md): rounding the node partial sums to 16 bits would
// round twice. The order of additions (node by node, then node sums) differs from library's, so
// fp32 results match library within rounding, not bitwise.
#include <cstddef>

#include "host_reduce.h"
#include "lmscale/core/error.h"
#include "mpi_context.h"

namespace lmscale::comm::detail {

void run_hier(MpiContext& ctx, const Request& req) {
  if (req.kind != OpKind::all_reduce) throw Error(fmt::format("hier algorithm: unexpected {}", op_kind_name(req.kind)));
  LMSCALE_CHECK(ctx.node != nullptr, "hier algorithm on a communicator without node groups");
  const std::size_t n = req.count;
  if (n == 0) return;
  const bool narrow = req.dtype == DType::bf16 || req.dtype == DType::f16;

  Request r = req;
  r.op = req.op == ReduceOp::avg ? ReduceOp::sum : req.op;
  if (narrow) {
    auto* acc = static_cast<float*>(ctx.scratch_a.get(n * sizeof(float)));
    widen(req.dtype, req.send, DType::f32, acc, n);
    r.send = acc;
    r.recv = acc;
    r.dtype = DType::f32;
  }
  // 1. inside the node
  run_shm(*ctx.node, r);
  // 2. between nodes, in place on the node sums
  if (ctx.leaders && ctx.leaders->size > 1) {
    Request l = r;
    l.send = l.recv;
    run_library(*ctx.leaders, l);
  }
  // 3. back inside the node, from the leader (node rank 0)
  Request b = r;
  b.kind = OpKind::broadcast;
  b.peer = 0;
  b.send = b.recv;
  run_shm(*ctx.node, b);

  if (narrow) {
    finish(DType::f32, r.recv, req.dtype, req.recv, req.op, ctx.size, n);
  } else if (req.op == ReduceOp::avg) {
    finish(req.dtype, req.recv, req.dtype, req.recv, req.op, ctx.size, n);
  }
}

}  // namespace lmscale::comm::detail
