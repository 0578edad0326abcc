#pragma once
// Communicator (docs/architecture.md §3): a group of ranks and the collectives among them. Backends:
// MpiCommunicator (host buffers, comm/mpi_communicator.h) and the NCCL communicator (device
// buffers, comm/nccl_communicator.h). docs/collectives.md has the full semantics.
//
// Buffers are raw pointers + element counts + DType, or Tensor views (same rules). Counts follow
// NCCL:
//   all_reduce(send, recv, count)            send, recv: count elements
//   reduce_scatter(send, recv, recv_count)   send: recv_count*size; rank r gets block r
//   all_gather(send, recv, send_count)       recv: send_count*size; block r is rank r's send
//   broadcast(buf, count, root)
// Uneven splits (sharded optimizers, FSDP): reduce_scatter_v / all_gather_v take counts[size];
// rank r's block starts at displacement counts[0] + ... + counts[r-1].
//   all_to_all(send, recv, count)            send, recv: count*size; block r of send goes to rank
//                                            r, block r of recv comes from rank r
//   all_to_all_v(send, send_counts, recv, recv_counts)   the same with per-rank block sizes on
//                                            each side (expert parallelism's dispatch and combine);
//                                            send_counts[r] on this rank must equal recv_counts[me]
//                                            on rank r (check mode verifies it)
// In place: all_reduce send == recv; reduce_scatter recv == send + offset of block r (the rest of
// send is unspecified afterwards); all_gather send == recv + offset of block r. Any other overlap
// of send and recv is a UsageError.
//
// Every call returns a Work; with CallOptions{.async=false} (the default) it is waited on before
// the call returns. Calls on one communicator run in the order they were made, on every rank; all
// ranks must make the same sequence of collective calls. With check mode on (set_check), every
// collective first all-gathers (op, count(s), dtype, reduce op, root, algo) and throws Error on
// every rank when they differ, instead of hanging or corrupting memory.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lmscale/comm/types.h"
#include "lmscale/comm/work.h"
#include "lmscale/core/device.h"
#include "lmscale/core/dtype.h"
#include "lmscale/core/error.h"
#include "lmscale/core/tensor.h"

namespace lmscale::comm {

enum class OpKind : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier, all_to_all };
const char* op_kind_name(OpKind k);   // "all-reduce", "reduce-scatter", ...

// One call as the backends see it, after argument checks.
struct Request {
  OpKind kind = OpKind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;              // all_reduce/broadcast/send/recv: elements; reduce_scatter: per-rank
                                      // recv count; all_gather: per-rank send count (even forms)
  std::vector<std::size_t> counts;    // v-forms: per-rank block sizes (empty for even forms);
                                      // all_to_all_v: the send blocks
  std::vector<std::size_t> recv_counts;   // all_to_all_v: the receive blocks (empty otherwise)
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int peer = 0;                       // broadcast: root; send/recv: the other rank
  int tag = 0;                        // send/recv
  Algo algo = Algo::automatic;

  bool uneven() const { return !counts.empty(); }
  std::size_t block_count(int r) const { return counts.empty() ? count : counts[static_cast<std::size_t>(r)]; }
  std::size_t block_offset(int r) const;   // elements before block r
  std::size_t total_count(int size) const; // elements of the full (size-block) buffer
  // all_to_all: the receive side's blocks (recv_counts, or `count` each for the even form).
  std::size_t recv_block_count(int r) const { return recv_counts.empty() ? count : recv_counts[static_cast<std::size_t>(r)]; }
  std::size_t recv_block_offset(int r) const;
  std::size_t recv_total_count(int size) const;
};

// How many collectives (and bytes, as bench-collectives counts them) went by one path since the
// communicator was made. Paths of the mpi backend: "shm" (lmscale's shared memory, one node),
// "hier" (shm inside each node + library between node leaders), and "library-node",
// "library-net", "ring-node", "ring-net" (MPI's own transports: "-node" when the whole group is on
// one node, "-net" when it spans nodes, so some messages cross the network).
struct PathUse {
  std::string path;
  std::uint64_t calls = 0;
  std::uint64_t bytes = 0;
};

// One send or receive of a grouped point-to-point exchange (Communicator::exchange).
struct P2POp {
  enum class Kind : std::uint8_t { send, recv };
  Kind kind = Kind::send;
  void* buf = nullptr;     // send: read; recv: written
  std::size_t count = 0;   // elements of dtype
  DType dtype = DType::f32;
  int peer = 0;
  int tag = 0;

  static P2POp send(const Tensor& t, int peer, int tag) {
    return {Kind::send, t.data(), static_cast<std::size_t>(t.numel()), t.dtype(), peer, tag};
  }
  static P2POp recv(const Tensor& t, int peer, int tag) {
    return {Kind::recv, t.data(), static_cast<std::size_t>(t.numel()), t.dtype(), peer, tag};
  }
};

// The order in which exchange() issues its operations on every backend: by tag, then sends before
// receives, then by peer (a stable sort). NCCL matches the point-to-point calls between two ranks
// by the order they are issued, not by tag, so two neighbours that each post one exchange with the
// same messages between them (e.g. with 2 pipeline stages both an activation and a gradient go
// from rank 0 to rank 1) must issue them in an order that depends on the messages alone, never on
// the rank or the caller's list order: the i-th message rank a sends to rank b (tag order) is then
// the i-th one b receives from a.
std::vector<P2POp> canonical_order(std::vector<P2POp> ops);

struct CommHealth {
  std::string error;   // empty: none
  bool busy = false;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  // Where buffers must live: cpu (mpi) or cuda (nccl).
  virtual Device device() const = 0;
  // A one-line description for logs ("mpi rank 1/4 algo=auto").
  virtual std::string describe() const;

  // The default algorithm of this communicator (validated by the backend).
  virtual void set_algo(Algo a) = 0;
  virtual Algo algo() const = 0;
  // Check mode: verify that all ranks make the same call before each collective.
  void set_check(bool on) { check_ = on; }
  bool check() const { return check_; }
  // nccl: the cudaStream_t that collectives are ordered after and that wait() orders after them
  // (default: the legacy default stream). mpi: ignored.
  virtual void set_compute_stream(void* stream) { (void)stream; }
  // Collectives per path so far (see PathUse), for the results file; empty where the backend does
  // not choose its transport itself (nccl: NCCL does, NCCL_DEBUG=INFO logs it).
  virtual std::vector<PathUse> path_uses() const { return {}; }
  // Gives up on every operation in flight, from any thread, so that a process stuck waiting for a
  // dead peer can exit (the step watchdog calls it just before MPI_Abort). nccl: ncclCommAbort;
  // mpi: nothing (MPI_Abort ends the stuck calls).
  virtual void abort() {}
  // For a watchdog thread (any thread, cheap, never blocks): an asynchronous error of this
  // communicator or of one split from it (nccl: ncclCommGetAsyncError; empty when none), and
  // whether any of them has communication in flight on this rank (nccl: its streams are not
  // idle; mpi: a call has not completed). A rank that hangs outside communication is not busy
  // while the ranks waiting for it are (jobs/resilience/rank_failure.h names the culprit from this).
  virtual CommHealth health() const { return {}; }

  // ---- raw buffers -------------------------------------------------------------------------
  Work all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, CallOptions o = {});
  Work reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, ReduceOp op,
                      CallOptions o = {});
  Work reduce_scatter_v(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                        ReduceOp op, CallOptions o = {});
  Work all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, CallOptions o = {});
  Work all_gather_v(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                    CallOptions o = {});
  Work broadcast(void* buf, std::size_t count, DType dtype, int root, CallOptions o = {});
  // All-to-all: block r of send (count elements, or send_counts[r]) goes to rank r; block r of
  // recv comes from rank r. Blocks are contiguous in rank order on both sides; send and recv must
  // not overlap. mpi: MPI_Alltoall(v) (algo library; ring, shm and hier fall back to it); nccl:
  // one ncclGroupStart/End around a ncclSend and a ncclRecv per peer.
  Work all_to_all(const void* send, void* recv, std::size_t count, DType dtype, CallOptions o = {});
  Work all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                    const std::vector<std::size_t>& recv_counts, DType dtype, CallOptions o = {});
  // Point to point. mpi: a send and a recv never block each other (both are posted without
  // waiting), so exchanges in any order are safe. nccl: an unpaired pattern in which both sides
  // send first may deadlock for large messages; use sendrecv. Check mode does not cover p2p, but a
  // recv whose incoming message has another size throws.
  Work send(const void* buf, std::size_t count, DType dtype, int peer, int tag = 0, CallOptions o = {});
  Work recv(void* buf, std::size_t count, DType dtype, int peer, int tag = 0, CallOptions o = {});
  // Both at once (pipeline stages): send to `to`, receive from `from`; returns when both are done.
  virtual Work sendrecv(const void* send_buf, std::size_t send_count, int to, void* recv_buf,
                        std::size_t recv_count, int from, DType dtype, int tag = 0, CallOptions o = {});
  // A group of sends and receives posted as one operation (the pipeline's communication points):
  // every op of `ops` is issued in canonical_order(ops); the Work completes when all of them have.
  // nccl: one ncclGroupStart/ncclGroupEnd around them (one launch on the communication stream, no
  // deadlock however the neighbours' sends and receives interleave, provided each posts its side
  // of the same messages in one exchange). mpi: nonblocking MPI_Isend/MPI_Irecv, matched by tag.
  // No two ops may share (kind, peer, tag): the canonical order would then not tell them apart.
  // Send buffers must stay alive and unmodified, receive buffers unread, until the Work is waited
  // on. An empty list gives a complete Work.
  virtual Work exchange(const std::vector<P2POp>& ops, CallOptions o = {});
  // In-place all-reduces of several tensors posted as one operation; the Work completes when all
  // of them have. nccl: one ncclGroupStart/ncclGroupEnd around them (one launch, and one host-side
  // launch cost instead of one per tensor: in NCCL's non-blocking mode each call's launch runs in a
  // background thread that the host polls for, ~0.1 ms, docs/collectives.md). Other backends: the
  // tensors' all-reduces in turn. Every rank must pass the same number of tensors of the same
  // sizes in the same order. An empty list gives a complete Work.
  virtual Work all_reduce_group(const std::vector<Tensor>& inout, ReduceOp op, CallOptions o = {});
  // All ranks reach this point (mpi: after all earlier calls are done; nccl: after the compute and
  // communication streams are drained).
  virtual void barrier() = 0;
  // A new communicator for the ranks with the same color, ordered by (key, rank); collective over
  // this communicator. color < 0: this rank joins no group and gets nullptr. The child inherits
  // algo and check mode.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // ---- Tensor views (device must match device(); counts from numel) -------------------------
  Work all_reduce(Tensor& inout, ReduceOp op, CallOptions o = {});
  Work all_reduce(const Tensor& send, Tensor& recv, ReduceOp op, CallOptions o = {});
  // send: recv.numel()*size elements.
  Work reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op, CallOptions o = {});
  // recv: send.numel()*size elements.
  Work all_gather(const Tensor& send, Tensor& recv, CallOptions o = {});
  Work broadcast(Tensor& buf, int root, CallOptions o = {});
  // Counts in elements of the tensors' common dtype; send.numel() = sum send_counts, recv.numel()
  // = sum recv_counts.
  Work all_to_all_v(const Tensor& send, const std::vector<std::size_t>& send_counts, Tensor& recv,
                    const std::vector<std::size_t>& recv_counts, CallOptions o = {});
  Work send(const Tensor& buf, int peer, int tag = 0, CallOptions o = {});
  Work recv(Tensor& buf, int peer, int tag = 0, CallOptions o = {});

 protected:
  // Starts one checked request; returns its Work (not yet waited on).
  virtual Work start(Request req) = 0;

 private:
  Work submit(Request req, const CallOptions& o);

 protected:
  // Argument checks of exchange() (peers, tags, devices, duplicates); returns the ops in
  // canonical order. For backends that override exchange().
  std::vector<P2POp> checked_exchange(const std::vector<P2POp>& ops) const;
  // Throws UsageError unless t (when not empty) lives where this backend's buffers do.
  void check_tensor(const Tensor& t, const char* what) const;

 private:
  bool check_ = false;
};

// The sum of one host double over c's ranks (loss sums, squared norms, flags): a blocking
// all-reduce. c must move host buffers (the mpi backend).
double sum_over(Communicator& c, double x);

}  // namespace lmscale::comm
