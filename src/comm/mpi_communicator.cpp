#include "lmscale/comm/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>

#include "comm_thread.h"
#include "lmscale/core/trace.h"
#include "consistency_check.h"
#include "mpi_check.h"
#include "mpi_context.h"

namespace lmscale::comm {

using detail::CommThread;
using detail::MpiContext;
using detail::Posted;

struct MpiCommunicator::Impl {
  MpiContext ctx;
  std::unique_ptr<CommThread> thread;   // reset first in the destructor: it uses ctx
  // The outstanding-work counters of the communicators split from this one (health()).
  mutable std::mutex children_mu;
  std::vector<std::shared_ptr<std::atomic<std::int64_t>>> children;
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, MpiOptions options) : impl_(std::make_unique<Impl>()), options_(options) {
  MpiContext& c = impl_->ctx;
  int world_rank = 0;
  MPI_Comm_rank(comm, &world_rank);
  LMSCALE_MPI_CHECK(MPI_Comm_dup(comm, &c.comm), world_rank);
  LMSCALE_MPI_CHECK(MPI_Comm_set_errhandler(c.comm, MPI_ERRORS_RETURN), world_rank);
  LMSCALE_MPI_CHECK(MPI_Comm_dup(c.comm, &c.ring), world_rank);
  LMSCALE_MPI_CHECK(MPI_Comm_set_errhandler(c.ring, MPI_ERRORS_RETURN), world_rank);
  MPI_Comm_rank(c.comm, &rank_);
  MPI_Comm_size(c.comm, &size_);
  c.rank = rank_;
  c.size = size_;

  // All ranks see the same answer: the node group of any rank is the whole group or it is not.
  MPI_Comm node = MPI_COMM_NULL;
  LMSCALE_MPI_CHECK(MPI_Comm_split_type(c.comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), rank_);
  int node_size = 0, node_rank = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  node_local_ = node_size == size_;
  c.node_local = node_local_;
  if (node_local_) {
    MPI_Comm_free(&node);
  } else {
    // Spans nodes: keep this node's ranks and one leader per node for the hier all-reduce, so a
    // collective can use shared memory inside each node and the network only between nodes.
    MPI_Comm leaders = MPI_COMM_NULL;
    LMSCALE_MPI_CHECK(MPI_Comm_split(c.comm, node_rank == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders), rank_);
    int lead = node_rank == 0 ? 1 : 0;
    LMSCALE_MPI_CHECK(MPI_Allreduce(&lead, &c.nodes, 1, MPI_INT, MPI_SUM, c.comm), rank_);
    auto sub = [&](MPI_Comm m) {
      auto s = std::make_unique<MpiContext>();
      s->comm = m;   // owned; `ring` stays null: only library and shm run on these
      LMSCALE_MPI_CHECK(MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN), rank_);
      MPI_Comm_rank(m, &s->rank);
      MPI_Comm_size(m, &s->size);
      s->options = options_;
      return s;
    };
    c.node = sub(node);
    c.node->node_local = true;
    if (leaders != MPI_COMM_NULL) c.leaders = sub(leaders);
  }
  nodes_ = c.nodes;
  c.options = options_;
  set_algo(options_.algo);
  set_check(options_.check);

  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  const bool threaded = provided == MPI_THREAD_MULTIPLE;
  if (!threaded && rank_ == 0) {
    static std::once_flag warned;   // one line per process, not per communicator
    std::call_once(warned, [] {
      std::fprintf(stderr, "lmscale: MPI does not provide MPI_THREAD_MULTIPLE; mpi collectives run on the calling "
                           "thread and async work does not overlap compute\n");
    });
  }
  impl_->thread = std::make_unique<CommThread>(threaded, rank_);
}

MpiCommunicator::~MpiCommunicator() {
  impl_->thread.reset();
  impl_->ctx.release();
}

std::string MpiCommunicator::describe() const {
  return fmt::format("mpi rank {}/{} algo={}{}{}{}", rank_, size_, algo_name(options_.algo),
                     node_local_ ? " node-local" : fmt::format(" nodes={}", nodes_), threaded() ? "" : " inline",
                     check() ? " check" : "");
}

bool MpiCommunicator::threaded() const { return impl_->thread && impl_->thread->threaded(); }

void MpiCommunicator::set_algo(Algo a) {
  if (a == Algo::shm && !node_local_)
    throw UsageError("algo=shm needs every rank of the communicator on one node; use library or ring");
  options_.algo = a;
}

namespace {

std::size_t buffer_bytes(const Request& req, int size) {
  const std::size_t es = dtype_size(req.dtype);
  switch (req.kind) {
    case OpKind::reduce_scatter: case OpKind::all_gather: case OpKind::all_to_all: return req.total_count(size) * es;
    default: return req.count * es;
  }
}

}  // namespace

Work MpiCommunicator::start(Request req) {
  const bool collective = req.kind != OpKind::send && req.kind != OpKind::recv && req.kind != OpKind::barrier;
  Algo algo = collective ? req.algo : Algo::library;
  const std::size_t bytes = collective ? buffer_bytes(req, size_) : 0;
  // hier pays off only when some node holds several ranks of the group (else it is library plus
  // two no-op node steps); on one node shm is the whole story.
  const bool hier_useful = !node_local_ && nodes_ < size_;
  if (algo == Algo::automatic) {
    algo = Algo::library;
    if (size_ > 1 && bytes >= options_.shm_min_bytes) {
      if (node_local_) algo = Algo::shm;
      else if (hier_useful && req.kind == OpKind::all_reduce) algo = Algo::hier;
    }
  }
  if (algo == Algo::shm && !node_local_)
    throw UsageError("algo=shm needs every rank of the communicator on one node; use library, ring or hier");
  // hier is an all-reduce algorithm; on one node it is shm
  if (algo == Algo::hier && req.kind != OpKind::all_reduce) algo = Algo::library;
  // all-to-all has no ring or shared-memory form: MPI's own (MPI_Alltoallv).
  if (req.kind == OpKind::all_to_all) algo = Algo::library;
  if (algo == Algo::hier && node_local_) algo = Algo::shm;
  req.algo = algo;
  if (collective) count_path(algo, bytes);

  const OpKind kind = req.kind;
  const std::size_t p2p_bytes = req.count * dtype_size(req.dtype);
  MpiContext* ctx = &impl_->ctx;
  const bool checked = check() && req.kind != OpKind::send && req.kind != OpKind::recv;
  auto job = [ctx, req = std::move(req), checked]() -> Posted {
    if (checked) {
      const detail::Descriptor d = detail::describe_call(req, req.algo, ctx->size);
      std::vector<detail::Descriptor> all(static_cast<std::size_t>(ctx->size));
      LMSCALE_MPI_CHECK(MPI_Allgather(d.data(), static_cast<int>(d.size()), MPI_INT64_T, all.data(),
                                      static_cast<int>(d.size()), MPI_INT64_T, ctx->comm),
                        ctx->rank);
      detail::verify_descriptors(all);
      if (req.kind == OpKind::all_to_all && req.uneven()) {
        // Pairwise: what each rank sends here against what this rank expects, then one flag for
        // all, so every rank throws alike.
        std::vector<std::int64_t> mine(req.counts.begin(), req.counts.end()), to_me(mine.size());
        LMSCALE_MPI_CHECK(MPI_Alltoall(mine.data(), 1, MPI_INT64_T, to_me.data(), 1, MPI_INT64_T, ctx->comm), ctx->rank);
        const std::string bad = detail::all_to_all_count_errors(req, to_me, ctx->rank);
        int local = bad.empty() ? 0 : 1, any = 0;
        LMSCALE_MPI_CHECK(MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, ctx->comm), ctx->rank);
        if (any != 0)
          throw detail::MismatchError("collective mismatch between ranks (check mode): all-to-all block sizes differ" +
                                      (bad.empty() ? std::string(" on another rank") : bad));
      }
    }
    Posted posted;
    switch (req.kind) {
      case OpKind::barrier:
        LMSCALE_MPI_CHECK(MPI_Barrier(ctx->comm), ctx->rank);
        return posted;
      case OpKind::send: {
        posted.requests.resize(1);
        LMSCALE_MPI_CHECK(MPI_Isend(req.send, detail::mpi_count(req.count, "send"), detail::mpi_datatype(req.dtype),
                                    req.peer, req.tag, ctx->comm, &posted.requests[0]),
                          ctx->rank);
        return posted;
      }
      case OpKind::recv: {
        posted.requests.resize(1);
        const MPI_Datatype type = detail::mpi_datatype(req.dtype);
        LMSCALE_MPI_CHECK(MPI_Irecv(req.recv, detail::mpi_count(req.count, "recv"), type, req.peer, req.tag,
                                    ctx->comm, &posted.requests[0]),
                          ctx->rank);
        posted.finish = [rank = ctx->rank, type, count = req.count, peer = req.peer](const std::vector<MPI_Status>& st) {
          int got = 0;
          MPI_Get_count(&st[0], type, &got);
          if (static_cast<std::size_t>(got) != count)
            throw Error(fmt::format("rank {}: recv from rank {} expected {} elements but the message had {}", rank,
                                    peer, count, got));
        };
        return posted;
      }
      default:
        break;
    }
    switch (req.algo) {
      case Algo::ring: detail::run_ring(*ctx, req); break;
      case Algo::shm: detail::run_shm(*ctx, req); break;
      case Algo::hier: detail::run_hier(*ctx, req); break;
      default: detail::run_library(*ctx, req); break;
    }
    return posted;
  };
  trace::Recorder* rec = trace::active();
  if (!rec) return Work(impl_->thread->submit(std::move(job), op_kind_name(kind)));
  // run.trace: the span from issue (here, on the caller's thread) to completion, and the part the
  // communication thread spent on it, with the op's name and bytes (core/trace.h).
  const double issued = rec->now_us();
  const bool p2p = kind == OpKind::send || kind == OpKind::recv;
  std::string args = fmt::format("\"bytes\":{},\"algo\":\"{}\"", p2p ? p2p_bytes : bytes, algo_name(algo));
  auto traced = [rec, issued, p2p, kind, args, job = std::move(job)]() -> Posted {
    const double started = rec->now_us();
    Posted posted = job();
    auto done = [rec, issued, started, p2p, kind, args] {
      const double now = rec->now_us();
      const std::string a = fmt::format("{},\"queued_us\":{:.3f}", args, started - issued);
      rec->complete(op_kind_name(kind), p2p ? trace::kCommP2P : trace::kComm, started, now - started, a);
      rec->async_span(op_kind_name(kind), p2p ? trace::kCommP2P : trace::kComm, issued, now, args);
    };
    if (posted.requests.empty()) {
      if (posted.finish) posted.finish({});
      posted.finish = nullptr;
      done();
      return posted;
    }
    posted.finish = [inner = std::move(posted.finish), done](const std::vector<MPI_Status>& st) {
      if (inner) inner(st);
      done();
    };
    return posted;
  };
  return Work(impl_->thread->submit(std::move(traced), op_kind_name(kind)));
}

void MpiCommunicator::count_path(Algo algo, std::size_t bytes) {
  std::string path = algo_name(algo);
  if (algo == Algo::library || algo == Algo::ring) path += node_local_ || size_ == 1 ? "-node" : "-net";
  std::lock_guard<std::mutex> lock(paths_mutex_);
  auto it = std::find_if(paths_.begin(), paths_.end(), [&](const PathUse& u) { return u.path == path; });
  if (it == paths_.end()) it = paths_.insert(paths_.end(), PathUse{path, 0, 0});
  it->calls += 1;
  it->bytes += bytes;
}

std::vector<PathUse> MpiCommunicator::path_uses() const {
  std::lock_guard<std::mutex> lock(paths_mutex_);
  return paths_;
}

void MpiCommunicator::barrier() {
  Request r;
  r.kind = OpKind::barrier;
  start(std::move(r)).wait();
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  MpiContext* ctx = &impl_->ctx;
  Work w(impl_->thread->submit([ctx, color, key, &part]() -> Posted {
    LMSCALE_MPI_CHECK(MPI_Comm_split(ctx->comm, color < 0 ? MPI_UNDEFINED : color, key, &part), ctx->rank);
    return {};
  }));
  w.wait();
  if (part == MPI_COMM_NULL) return nullptr;
  MpiOptions o = options_;
  o.check = check();
  auto child = std::make_unique<MpiCommunicator>(part, o);
  MPI_Comm_free(&part);
  {
    std::lock_guard lk(impl_->children_mu);
    impl_->children.push_back(child->impl_->thread->outstanding());
  }
  return child;
}

CommHealth MpiCommunicator::health() const {
  CommHealth h;
  h.busy = impl_->thread->outstanding()->load(std::memory_order_relaxed) > 0;
  std::lock_guard lk(impl_->children_mu);
  for (const auto& c : impl_->children) h.busy = h.busy || c->load(std::memory_order_relaxed) > 0;
  return h;
}

}  // namespace lmscale::comm
