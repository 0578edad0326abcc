// Argument checks shared by all backends, the Tensor conveniences, and synchronous calls as
// async + wait.
#include "lmscale/comm/communicator.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "lmscale/core/error.h"

namespace lmscale::comm {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::all_reduce: return "all-reduce";
    case OpKind::reduce_scatter: return "reduce-scatter";
    case OpKind::all_gather: return "all-gather";
    case OpKind::broadcast: return "broadcast";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::barrier: return "barrier";
    case OpKind::all_to_all: return "all-to-all";
  }
  return "?";
}

std::size_t Request::block_offset(int r) const {
  if (counts.empty()) return count * static_cast<std::size_t>(r);
  return std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0});
}

std::size_t Request::total_count(int size) const {
  if (counts.empty()) return count * static_cast<std::size_t>(size);
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

std::size_t Request::recv_block_offset(int r) const {
  if (recv_counts.empty()) return count * static_cast<std::size_t>(r);
  return std::accumulate(recv_counts.begin(), recv_counts.begin() + r, std::size_t{0});
}

std::size_t Request::recv_total_count(int size) const {
  if (recv_counts.empty()) return count * static_cast<std::size_t>(size);
  return std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
}

std::string Communicator::describe() const {
  return fmt::format("{} rank {}/{} algo={}{}", backend_name(backend()), rank(), size(), algo_name(algo()),
                     check() ? " check" : "");
}

namespace {

bool overlaps(const void* a, std::size_t na, const void* b, std::size_t nb) {
  if (na == 0 || nb == 0) return false;
  auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

// Completes when all of its parts have.
class WorkGroup final : public WorkState {
 public:
  explicit WorkGroup(std::vector<Work> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& w : parts_) w.wait();
  }
  void synchronize() override {
    for (auto& w : parts_) w.synchronize();
  }
  bool is_completed() override {
    for (auto& w : parts_)
      if (!w.is_completed()) return false;
    return true;
  }

 private:
  std::vector<Work> parts_;
};

}  // namespace

Work Communicator::submit(Request req, const CallOptions& o) {
  const char* name = op_kind_name(req.kind);
  const bool reduces = req.kind == OpKind::all_reduce || req.kind == OpKind::reduce_scatter;
  if (!is_comm_dtype(req.dtype) && !(is_comm_byte_dtype(req.dtype) && !reduces))
    throw UsageError(fmt::format("{}: dtype {} cannot be {} (use fp32, fp64, bf16, fp16, int32, int64; uint8 and "
                                 "fp8 are moved, never reduced)",
                                 name, dtype_name(req.dtype), reduces ? "reduced" : "communicated"));
  const int n = size();
  if (req.uneven() && req.counts.size() != static_cast<std::size_t>(n))
    throw UsageError(fmt::format("{}: {} counts given for a group of {} ranks", name, req.counts.size(), n));
  if (req.kind == OpKind::all_to_all && req.uneven() != !req.recv_counts.empty())
    throw UsageError(fmt::format("{}: send counts and receive counts must both be given (all_to_all_v) or neither", name));
  if (!req.recv_counts.empty() && req.recv_counts.size() != static_cast<std::size_t>(n))
    throw UsageError(fmt::format("{}: {} receive counts given for a group of {} ranks", name, req.recv_counts.size(), n));
  if ((req.kind == OpKind::broadcast || req.kind == OpKind::send || req.kind == OpKind::recv) &&
      (req.peer < 0 || req.peer >= n))
    throw UsageError(fmt::format("{}: rank {} is not in the group of {} ranks", name, req.peer, n));
  if (req.tag < 0) throw UsageError(fmt::format("{}: tag {} must be >= 0", name, req.tag));

  const std::size_t es = dtype_size(req.dtype);
  std::size_t send_n = 0, recv_n = 0;   // elements read from send, written to recv
  const void* in_place_send = nullptr;  // the send pointer that means "in place"
  switch (req.kind) {
    case OpKind::all_reduce:
      send_n = recv_n = req.count;
      in_place_send = req.recv;
      break;
    case OpKind::reduce_scatter:
      send_n = req.total_count(n);
      recv_n = req.block_count(rank());
      if (req.recv == static_cast<const char*>(req.send) + req.block_offset(rank()) * es) in_place_send = req.send;
      break;
    case OpKind::all_gather:
      send_n = req.block_count(rank());
      recv_n = req.total_count(n);
      in_place_send = static_cast<char*>(req.recv) + req.block_offset(rank()) * es;
      break;
    case OpKind::broadcast: case OpKind::recv:
      recv_n = req.count;
      break;
    case OpKind::send:
      send_n = req.count;
      break;
    case OpKind::all_to_all:
      send_n = req.total_count(n);
      recv_n = req.recv_total_count(n);
      break;
    case OpKind::barrier:
      break;
  }
  if ((send_n > 0 && req.send == nullptr) || (recv_n > 0 && req.recv == nullptr))
    throw UsageError(fmt::format("{}: null buffer for {} elements", name, std::max(send_n, recv_n)));
  if (req.send != in_place_send && overlaps(req.send, send_n * es, req.recv, recv_n * es))
    throw UsageError(fmt::format("{}: send and recv buffers overlap but are not the in-place layout", name));
  req.algo = o.algo.value_or(algo());
  Work w = start(std::move(req));
  if (!o.async) w.wait();
  return w;
}

Work Communicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                              CallOptions o) {
  Request r;
  r.kind = OpKind::all_reduce, r.send = send, r.recv = recv, r.count = count, r.dtype = dtype, r.op = op;
  return submit(std::move(r), o);
}

Work Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, ReduceOp op,
                                  CallOptions o) {
  Request r;
  r.kind = OpKind::reduce_scatter, r.send = send, r.recv = recv, r.count = recv_count, r.dtype = dtype, r.op = op;
  return submit(std::move(r), o);
}

Work Communicator::reduce_scatter_v(const void* send, void* recv, const std::vector<std::size_t>& counts,
                                    DType dtype, ReduceOp op, CallOptions o) {
  Request r;
  r.kind = OpKind::reduce_scatter, r.send = send, r.recv = recv, r.counts = counts, r.dtype = dtype, r.op = op;
  return submit(std::move(r), o);
}

Work Communicator::all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, CallOptions o) {
  Request r;
  r.kind = OpKind::all_gather, r.send = send, r.recv = recv, r.count = send_count, r.dtype = dtype;
  return submit(std::move(r), o);
}

Work Communicator::all_gather_v(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                                CallOptions o) {
  Request r;
  r.kind = OpKind::all_gather, r.send = send, r.recv = recv, r.counts = counts, r.dtype = dtype;
  return submit(std::move(r), o);
}

Work Communicator::broadcast(void* buf, std::size_t count, DType dtype, int root, CallOptions o) {
  Request r;
  r.kind = OpKind::broadcast, r.send = buf, r.recv = buf, r.count = count, r.dtype = dtype, r.peer = root;
  return submit(std::move(r), o);
}

Work Communicator::all_to_all(const void* send, void* recv, std::size_t count, DType dtype, CallOptions o) {
  Request r;
  r.kind = OpKind::all_to_all, r.send = send, r.recv = recv, r.count = count, r.dtype = dtype;
  return submit(std::move(r), o);
}

Work Communicator::all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                                const std::vector<std::size_t>& recv_counts, DType dtype, CallOptions o) {
  Request r;
  r.kind = OpKind::all_to_all, r.send = send, r.recv = recv, r.counts = send_counts, r.recv_counts = recv_counts;
  r.dtype = dtype;
  return submit(std::move(r), o);
}

Work Communicator::send(const void* buf, std::size_t count, DType dtype, int peer, int tag, CallOptions o) {
  Request r;
  r.kind = OpKind::send, r.send = buf, r.count = count, r.dtype = dtype, r.peer = peer, r.tag = tag;
  return submit(std::move(r), o);
}

Work Communicator::recv(void* buf, std::size_t count, DType dtype, int peer, int tag, CallOptions o) {
  Request r;
  r.kind = OpKind::recv, r.recv = buf, r.count = count, r.dtype = dtype, r.peer = peer, r.tag = tag;
  return submit(std::move(r), o);
}

Work Communicator::sendrecv(const void* send_buf, std::size_t send_count, int to, void* recv_buf,
                            std::size_t recv_count, int from, DType dtype, int tag, CallOptions o) {
  CallOptions a = o;
  a.async = true;
  std::vector<Work> parts;
  parts.push_back(recv(recv_buf, recv_count, dtype, from, tag, a));
  parts.push_back(send(send_buf, send_count, dtype, to, tag, a));
  Work w(std::make_shared<WorkGroup>(std::move(parts)));
  if (!o.async) w.wait();
  return w;
}

std::vector<P2POp> canonical_order(std::vector<P2POp> ops) {
  std::stable_sort(ops.begin(), ops.end(), [](const P2POp& a, const P2POp& b) {
    if (a.tag != b.tag) return a.tag < b.tag;
    if (a.kind != b.kind) return a.kind == P2POp::Kind::send;
    return a.peer < b.peer;
  });
  return ops;
}

std::vector<P2POp> Communicator::checked_exchange(const std::vector<P2POp>& ops) const {
  const int n = size();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& a = ops[i];
    const char* what = a.kind == P2POp::Kind::send ? "exchange (send)" : "exchange (recv)";
    if (a.peer < 0 || a.peer >= n)
      throw UsageError(fmt::format("{}: rank {} is not in the group of {} ranks", what, a.peer, n));
    if (a.tag < 0) throw UsageError(fmt::format("{}: tag {} must be >= 0", what, a.tag));
    if (!is_comm_dtype(a.dtype) && !is_comm_byte_dtype(a.dtype))
      throw UsageError(fmt::format("{}: dtype {} cannot be communicated", what, dtype_name(a.dtype)));
    if (a.count > 0 && a.buf == nullptr)
      throw UsageError(fmt::format("{}: null buffer for {} elements", what, a.count));
    for (std::size_t j = 0; j < i; ++j)
      if (ops[j].kind == a.kind && ops[j].peer == a.peer && ops[j].tag == a.tag)
        throw UsageError(fmt::format("{}: two operations with peer {} and tag {} in one exchange (their order would "
                                     "be ambiguous)", what, a.peer, a.tag));
  }
  return canonical_order(ops);
}

Work Communicator::exchange(const std::vector<P2POp>& ops, CallOptions o) {
  // The default (mpi): each op posted asynchronously in canonical order; MPI matches by
  // (source, tag), so the order does not matter here, but every backend issues the same one.
  CallOptions a = o;
  a.async = true;
  std::vector<Work> parts;
  for (const P2POp& op : checked_exchange(ops)) {
    if (op.kind == P2POp::Kind::send) parts.push_back(send(op.buf, op.count, op.dtype, op.peer, op.tag, a));
    else parts.push_back(recv(op.buf, op.count, op.dtype, op.peer, op.tag, a));
  }
  if (parts.empty()) return Work();
  Work w(std::make_shared<WorkGroup>(std::move(parts)));
  if (!o.async) w.wait();
  return w;
}

Work Communicator::all_reduce_group(const std::vector<Tensor>& inout, ReduceOp op, CallOptions o) {
  CallOptions a = o;
  a.async = true;
  std::vector<Work> parts;
  for (const Tensor& t : inout) {
    Tensor v = t;   // a view: all_reduce writes through it
    parts.push_back(all_reduce(v, op, a));
  }
  if (parts.empty()) return Work();
  Work w(std::make_shared<WorkGroup>(std::move(parts)));
  if (!o.async) w.wait();
  return w;
}

// ---- Tensor views ---------------------------------------------------------------------------

void Communicator::check_tensor(const Tensor& t, const char* what) const {
  if (t.numel() > 0 && t.device() != device())
    throw UsageError(fmt::format("{}: tensor on {} but the {} communicator works on {} memory", what,
                                 device_name(t.device()), backend_name(backend()), device_name(device())));
}

Work Communicator::all_reduce(Tensor& inout, ReduceOp op, CallOptions o) {
  check_tensor(inout, "all-reduce");
  return all_reduce(inout.data(), inout.data(), static_cast<std::size_t>(inout.numel()), inout.dtype(), op, o);
}

Work Communicator::all_reduce(const Tensor& send, Tensor& recv, ReduceOp op, CallOptions o) {
  check_tensor(send, "all-reduce");
  check_tensor(recv, "all-reduce");
  if (send.numel() != recv.numel() || send.dtype() != recv.dtype())
    throw UsageError(fmt::format("all-reduce: send {} {} and recv {} {} differ", dtype_name(send.dtype()),
                                 shape_str(send.shape()), dtype_name(recv.dtype()), shape_str(recv.shape())));
  return all_reduce(send.data(), recv.data(), static_cast<std::size_t>(recv.numel()), recv.dtype(), op, o);
}

Work Communicator::reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op, CallOptions o) {
  check_tensor(send, "reduce-scatter");
  check_tensor(recv, "reduce-scatter");
  if (send.numel() != recv.numel() * size() || send.dtype() != recv.dtype())
    throw UsageError(fmt::format("reduce-scatter: send must hold size ({}) x recv elements of one dtype; got send {} {}, "
                                 "recv {} {}", size(), dtype_name(send.dtype()), shape_str(send.shape()),
                                 dtype_name(recv.dtype()), shape_str(recv.shape())));
  return reduce_scatter(send.data(), recv.data(), static_cast<std::size_t>(recv.numel()), recv.dtype(), op, o);
}

Work Communicator::all_gather(const Tensor& send, Tensor& recv, CallOptions o) {
  check_tensor(send, "all-gather");
  check_tensor(recv, "all-gather");
  if (recv.numel() != send.numel() * size() || send.dtype() != recv.dtype())
    throw UsageError(fmt::format("all-gather: recv must hold size ({}) x send elements of one dtype; got send {} {}, "
                                 "recv {} {}", size(), dtype_name(send.dtype()), shape_str(send.shape()),
                                 dtype_name(recv.dtype()), shape_str(recv.shape())));
  return all_gather(send.data(), recv.data(), static_cast<std::size_t>(send.numel()), send.dtype(), o);
}

Work Communicator::broadcast(Tensor& buf, int root, CallOptions o) {
  check_tensor(buf, "broadcast");
  return broadcast(buf.data(), static_cast<std::size_t>(buf.numel()), buf.dtype(), root, o);
}

Work Communicator::all_to_all_v(const Tensor& send, const std::vector<std::size_t>& send_counts, Tensor& recv,
                                const std::vector<std::size_t>& recv_counts, CallOptions o) {
  check_tensor(send, "all-to-all");
  check_tensor(recv, "all-to-all");
  const auto total = [](const std::vector<std::size_t>& c) { return std::accumulate(c.begin(), c.end(), std::size_t{0}); };
  if (send.dtype() != recv.dtype() || static_cast<std::size_t>(send.numel()) != total(send_counts) ||
      static_cast<std::size_t>(recv.numel()) != total(recv_counts))
    throw UsageError(fmt::format("all-to-all: send {} {} for {} elements, recv {} {} for {} (one dtype, the counts' "
                                 "sums)", dtype_name(send.dtype()), shape_str(send.shape()), total(send_counts),
                                 dtype_name(recv.dtype()), shape_str(recv.shape()), total(recv_counts)));
  return all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, send.dtype(), o);
}

Work Communicator::send(const Tensor& buf, int peer, int tag, CallOptions o) {
  check_tensor(buf, "send");
  return send(buf.data(), static_cast<std::size_t>(buf.numel()), buf.dtype(), peer, tag, o);
}

Work Communicator::recv(Tensor& buf, int peer, int tag, CallOptions o) {
  check_tensor(buf, "recv");
  return recv(buf.data(), static_cast<std::size_t>(buf.numel()), buf.dtype(), peer, tag, o);
}

double sum_over(Communicator& c, double x) {
  double y = 0;
  c.all_reduce(&x, &y, 1, DType::f64, ReduceOp::sum).wait();
  return y;
}

}  // namespace lmscale::comm
