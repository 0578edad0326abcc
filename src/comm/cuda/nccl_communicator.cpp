// The nccl backend (comm/nccl_communicator.h): NCCL collectives on a communication stream that is
// ordered after the caller's compute stream by events.
#include "lmscale/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "../consistency_check.h"
#include "../mpi_check.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "lmscale/core/trace.h"

namespace lmscale::comm {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: case DType::e4m3: case DType::e5m2: return ncclUint8;   // moved, never reduced
    default: throw UsageError(fmt::format("nccl backend: dtype {} not supported", dtype_name(t)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

// Events without timing, reused: recording a fresh event per call would cost a driver call each.
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    for (auto e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t get() {
    {
      std::lock_guard lk(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void put(cudaEvent_t e) {
    std::lock_guard lk(mu_);
    free_.push_back(e);
  }
  int device() const { return device_; }

 private:
  int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// Non-blocking mode (ncclConfig_t blocking = 0): every NCCL call may return ncclInProgress while
// NCCL finishes it in the background (initialisation, split, a first use's connection setup, a
// group's launch); the caller then polls ncclCommGetAsyncError until the state leaves
// ncclInProgress before the next call on that communicator. A call that returns ncclSuccess (the
// steady state of collectives) costs nothing more. The point: no NCCL call can block the host
// forever, so a watchdog thread can read the asynchronous error and ncclCommAbort a communicator
// whose peer died or hangs (jobs/resilience/step_watchdog.h).
//
// NCCL 2.2x launches every call of a non-blocking communicator (each is a group) in a background
// thread and returns ncclInProgress, so the steady state polls too: for about 0.03-0.1 ms. The
// poll spins (yielding) for its first millisecond and only then sleeps between polls: a sleep's
// granularity (~60 us) cost every collective and all-to-all that much again (the ~150 us floor
// measured in docs/collectives.md); the long waits (initialisation, a first connection) sleep.
ncclResult_t wait_ready(ncclComm_t comm, ncclResult_t r) {
  if (r != ncclInProgress) return r;
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
  }
  return r;
}

// The NCCL communicator, its stream and events; shared with the Work handles so that a Work can
// still be synchronised (and its async errors read) after the Communicator object is gone.
struct NcclShared {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int rank = 0, size = 1, device = 0;
  bool failed = false;
  std::atomic<bool> aborted{false};
  EventPool events;
  // The communicators split from this one (health() and abort() cover them too).
  std::mutex children_mu;
  std::vector<std::weak_ptr<NcclShared>> children;

  NcclShared(ncclComm_t c, int r, int n, int dev) : comm(c), rank(r), size(n), device(dev), events(dev) {
    cudaSetDevice(device);
    int lo = 0, hi = 0;
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    // Non-blocking: no implicit ordering with the legacy default stream; highest priority so
    // communication kernels are scheduled ahead of compute they overlap.
    LMSCALE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, hi));
  }
  ~NcclShared() {
    cudaSetDevice(device);
    if (aborted.load()) {
      // ncclCommAbort has freed the communicator already.
    } else if (failed) {
      ncclCommAbort(comm);
    } else {
      cudaStreamSynchronize(stream);
      // Non-blocking: finalize may return ncclInProgress (flushing); destroy once it is done.
      if (wait_ready(comm, ncclCommFinalize(comm)) == ncclSuccess)
        ncclCommDestroy(comm);
      else
        ncclCommAbort(comm);
    }
    cudaStreamDestroy(stream);
  }

  [[noreturn]] void raise(const char* what, ncclResult_t r) {
    failed = true;
    throw Error(fmt::format("nccl {} failed on rank {}/{} (cuda device {}): {}: {}", what, rank, size, device,
                            ncclGetErrorString(r), ncclGetLastError(comm)));
  }
  // After each NCCL call: waits out ncclInProgress (non-blocking mode), raises an error.
  void check(ncclResult_t r, const char* what) {
    r = wait_ready(comm, r);
    if (r != ncclSuccess) raise(what, r);
  }
  void check_async(const char* what) {
    ncclResult_t a = ncclSuccess;
    ncclCommGetAsyncError(comm, &a);
    if (a != ncclSuccess && a != ncclInProgress) raise(what, a);
  }
  void add_child(const std::shared_ptr<NcclShared>& c) {
    std::lock_guard lk(children_mu);
    children.push_back(c);
  }
  std::vector<std::shared_ptr<NcclShared>> live_children() {
    std::lock_guard lk(children_mu);
    std::vector<std::shared_ptr<NcclShared>> out;
    for (auto& w : children)
      if (auto c = w.lock()) out.push_back(std::move(c));
    return out;
  }
  // From the watchdog thread: this communicator's async error and whether its stream is idle.
  void health(CommHealth& h) {
    if (aborted.load()) return;
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &a) == ncclSuccess && a != ncclSuccess && a != ncclInProgress &&
        h.error.empty())
      h.error = fmt::format("nccl error on rank {}/{} (cuda device {}): {}: {}", rank, size, device,
                            ncclGetErrorString(a), ncclGetLastError(comm));
    if (cudaStreamQuery(stream) == cudaErrorNotReady) h.busy = true;
  }
  void abort() {
    if (!aborted.exchange(true)) ncclCommAbort(comm);
  }
};

class NcclWork final : public WorkState {
 public:
  NcclWork(std::shared_ptr<NcclShared> shared, cudaEvent_t done, cudaStream_t compute, const char* what)
      : shared_(std::move(shared)), done_(done), compute_(compute), what_(what) {}
  ~NcclWork() override { shared_->events.put(done_); }

  void wait() override {
    // run.trace: timing events on the compute stream on both sides of the wait: the range is how
    // long the compute stream stalls for the comm stream ("cuda compute" track).
    trace::Recorder* rec = trace::active();
    const int token = rec ? rec->device_begin(compute_) : -1;
    LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    if (rec) rec->device_end(token, fmt::format("wait {}", what_), trace::kCudaCompute, {}, compute_);
  }
  void synchronize() override {
    // Poll rather than cudaEventSynchronize: a failed peer must surface as an error, not a hang.
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady)
        throw Error(fmt::format("nccl {} on rank {}: {}", what_, shared_->rank, cudaGetErrorString(q)));
      shared_->check_async(what_);
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  bool is_completed() override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  std::shared_ptr<NcclShared> shared_;
  cudaEvent_t done_;
  cudaStream_t compute_;
  const char* what_;
};

// The configuration of every communicator made here (init and split): non-blocking (see
// wait_ready) and, with parallel.comm_sms, at most max_ctas CTAs (SMs; one per channel) for NCCL's
// kernels, so the GEMMs planned for the other SMs never wait for one (ops::Runtime::set_comm_sms).
ncclConfig_t nonblocking_config(int max_ctas) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (max_ctas > 0) {
    config.maxCTAs = max_ctas;
    config.minCTAs = 1;
  }
  return config;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm mpi, ncclComm_t comm, int device, NcclOptions options) : mpi_(mpi), max_ctas_(options.max_ctas) {
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    shared_ = std::make_shared<NcclShared>(comm, rank_, size_, device);
    set_check(options.check);
  }
  ~NcclCommunicator() override {
    shared_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::nccl; }
  Device device() const override { return Device::cuda; }
  void set_algo(Algo a) override {
    if (a == Algo::ring || a == Algo::shm || a == Algo::hier)
      throw UsageError(fmt::format("algo={} is not available on the nccl backend (use library)", algo_name(a)));
    algo_ = a;
  }
  Algo algo() const override { return algo_; }
  void set_compute_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }
  // From the watchdog thread (jobs/resilience/step_watchdog.h): this communicator and those split from it.
  // Run on 2 GPUs by scripts/gpu/rank_failure.sh (no device in CI).
  void abort() override {
    for (auto& c : shared_->live_children()) c->abort();
    shared_->abort();
  }
  CommHealth health() const override {
    CommHealth h;
    cudaSetDevice(shared_->device);   // per thread: the watchdog's may not be set yet
    shared_->health(h);
    for (auto& c : shared_->live_children()) c->health(h);
    return h;
  }

  void barrier() override {
    LMSCALE_CUDA_CHECK(cudaSetDevice(shared_->device));
    LMSCALE_CUDA_CHECK(cudaStreamSynchronize(compute_));
    LMSCALE_CUDA_CHECK(cudaStreamSynchronize(shared_->stream));
    shared_->check_async("barrier");
    if (check()) verify(Request{});
    LMSCALE_MPI_CHECK(MPI_Barrier(mpi_), rank_);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm part = MPI_COMM_NULL;
    LMSCALE_MPI_CHECK(MPI_Comm_split(mpi_, color < 0 ? MPI_UNDEFINED : color, key, &part), rank_);
    // The child is non-blocking too. A non-blocking split behaves like a collective on the
    // parent: the child's handle is filled in only when the parent leaves ncclInProgress (NCCL
    // issue 1472; the call may even return ncclSuccess with the handle still unset), so the parent
    // is always polled first, then the child until it is ready.
    ncclConfig_t config = nonblocking_config(max_ctas_);
    ncclComm_t child = nullptr;
    LMSCALE_CUDA_CHECK(cudaSetDevice(shared_->device));
    ncclResult_t r = ncclCommSplit(shared_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    if (r == ncclSuccess || r == ncclInProgress) r = wait_ready(shared_->comm, ncclInProgress);
    if (r == ncclSuccess && child) r = wait_ready(child, ncclInProgress);
    if (r != ncclSuccess) shared_->raise("ncclCommSplit", r);
    if (part == MPI_COMM_NULL) return nullptr;
    if (!child) shared_->raise("ncclCommSplit (no communicator returned)", ncclInternalError);
    NcclOptions o;
    o.check = check();
    o.max_ctas = max_ctas_;
    auto c = std::make_unique<NcclCommunicator>(part, child, shared_->device, o);
    shared_->add_child(c->shared_);
    c->set_algo(algo_);
    c->set_compute_stream(compute_);
    return c;
  }

  Work sendrecv(const void* send_buf, std::size_t send_count, int to, void* recv_buf, std::size_t recv_count,
                int from, DType dtype, int tag, CallOptions o) override {
    (void)tag;   // NCCL matches point-to-point calls by order, not by tag
    if (to < 0 || to >= size_ || from < 0 || from >= size_)
      throw UsageError(fmt::format("sendrecv: ranks {} / {} not in the group of {}", to, from, size_));
    const ncclDataType_t type = nccl_type(dtype);
    Work w = launch("sendrecv", (send_count + recv_count) * dtype_size(dtype), [&](cudaStream_t s) {
      shared_->check(ncclGroupStart(), "sendrecv (ncclGroupStart)");
      shared_->check(ncclSend(send_buf, send_count, type, to, shared_->comm, s), "sendrecv (ncclSend)");
      shared_->check(ncclRecv(recv_buf, recv_count, type, from, shared_->comm, s), "sendrecv (ncclRecv)");
      shared_->check(ncclGroupEnd(), "sendrecv (ncclGroupEnd)");
    });
    if (!o.async) w.wait();
    return w;
  }

  // One group: NCCL runs the sends and receives together, so neighbours that both send before
  // they receive cannot block each other, and issues them in canonical_order on every rank, so
  // several messages between the same two ranks are matched by that order (NCCL has no tags).
  Work exchange(const std::vector<P2POp>& ops, CallOptions o) override {
    const std::vector<P2POp> ordered = checked_exchange(ops);
    if (ordered.empty()) return Work();
    std::size_t bytes = 0;
    for (const P2POp& op : ordered) bytes += op.count * dtype_size(op.dtype);
    Work w = launch("exchange", bytes, [&](cudaStream_t s) {
      shared_->check(ncclGroupStart(), "exchange (ncclGroupStart)");
      for (const P2POp& op : ordered) {
        const ncclDataType_t type = nccl_type(op.dtype);
        if (op.kind == P2POp::Kind::send)
          shared_->check(ncclSend(op.buf, op.count, type, op.peer, shared_->comm, s), "exchange (ncclSend)");
        else
          shared_->check(ncclRecv(op.buf, op.count, type, op.peer, shared_->comm, s), "exchange (ncclRecv)");
      }
      shared_->check(ncclGroupEnd(), "exchange (ncclGroupEnd)");
    });
    if (!o.async) w.wait();
    return w;
  }

  // One group of in-place all-reduces: one launch on the communication stream and one wait for
  // NCCL's background launch (non-blocking mode) instead of one per tensor.
  Work all_reduce_group(const std::vector<Tensor>& inout, ReduceOp op, CallOptions o) override {
    std::size_t bytes = 0;
    for (const Tensor& t : inout) {
      check_tensor(t, "all-reduce group");
      if (check()) {
        Request req;
        req.kind = OpKind::all_reduce, req.send = t.data(), req.recv = t.data();
        req.count = static_cast<std::size_t>(t.numel()), req.dtype = t.dtype(), req.op = op;
        req.algo = Algo::library;
        verify(req);
      }
      bytes += static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
    }
    if (inout.empty()) return Work();
    Work w = launch("all-reduce", bytes, [&](cudaStream_t s) {
      shared_->check(ncclGroupStart(), "all-reduce group (ncclGroupStart)");
      for (const Tensor& t : inout)
        shared_->check(ncclAllReduce(t.data(), const_cast<void*>(t.data()), static_cast<std::size_t>(t.numel()),
                                     nccl_type(t.dtype()), nccl_op(op), shared_->comm, s),
                       "all-reduce group (ncclAllReduce)");
      shared_->check(ncclGroupEnd(), "all-reduce group (ncclGroupEnd)");
    });
    if (!o.async) w.wait();
    return w;
  }

 protected:
  Work start(Request req) override {
    if (req.algo == Algo::ring || req.algo == Algo::shm || req.algo == Algo::hier)
      throw UsageError(fmt::format("algo={} is not available on the nccl backend (use library)", algo_name(req.algo)));
    req.algo = Algo::library;
    if (check() && req.kind != OpKind::send && req.kind != OpKind::recv) verify(req);
    const ncclDataType_t type = nccl_type(req.dtype);
    const std::size_t es = dtype_size(req.dtype);
    ncclComm_t comm = shared_->comm;
    const char* what = op_kind_name(req.kind);
    const bool blocks = req.kind == OpKind::reduce_scatter || req.kind == OpKind::all_gather ||
                        req.kind == OpKind::all_to_all;
    const std::size_t bytes = (blocks ? req.total_count(size_) : req.count) * es;
    return launch(what, bytes, [&](cudaStream_t s) {
      switch (req.kind) {
        case OpKind::all_reduce:
          shared_->check(ncclAllReduce(req.send, req.recv, req.count, type, nccl_op(req.op), comm, s), "all-reduce");
          return;
        case OpKind::reduce_scatter:
          if (!req.uneven()) {
            shared_->check(ncclReduceScatter(req.send, req.recv, req.count, type, nccl_op(req.op), comm, s),
                           "reduce-scatter");
            return;
          }
          // One reduce per block to its owner, fused into one launch by the group.
          shared_->check(ncclGroupStart(), "reduce-scatter-v (ncclGroupStart)");
          for (int q = 0; q < size_; ++q) {
            if (req.block_count(q) == 0) continue;
            const char* src = static_cast<const char*>(req.send) + req.block_offset(q) * es;
            void* dst = q == rank_ ? req.recv : const_cast<char*>(src);   // only the root writes
            shared_->check(ncclReduce(src, dst, req.block_count(q), type, nccl_op(req.op), q, comm, s),
                           "reduce-scatter-v (ncclReduce)");
          }
          shared_->check(ncclGroupEnd(), "reduce-scatter-v (ncclGroupEnd)");
          return;
        case OpKind::all_gather:
          if (!req.uneven()) {
            shared_->check(ncclAllGather(req.send, req.recv, req.count, type, comm, s), "all-gather");
            return;
          }
          shared_->check(ncclGroupStart(), "all-gather-v (ncclGroupStart)");
          for (int q = 0; q < size_; ++q) {
            if (req.block_count(q) == 0) continue;
            char* dst = static_cast<char*>(req.recv) + req.block_offset(q) * es;
            const void* src = q == rank_ ? req.send : dst;   // only the root reads
            shared_->check(ncclBroadcast(src, dst, req.block_count(q), type, q, comm, s), "all-gather-v (ncclBroadcast)");
          }
          shared_->check(ncclGroupEnd(), "all-gather-v (ncclGroupEnd)");
          return;
        case OpKind::broadcast:
          shared_->check(ncclBroadcast(req.recv, req.recv, req.count, type, req.peer, comm, s), "broadcast");
          return;
        case OpKind::send:
          shared_->check(ncclSend(req.send, req.count, type, req.peer, comm, s), "send");
          return;
        case OpKind::recv:
          shared_->check(ncclRecv(req.recv, req.count, type, req.peer, comm, s), "recv");
          return;
        case OpKind::all_to_all:
          // One group of a send and a receive per peer (NCCL has no all-to-all-v of its own); the
          // group makes them one launch in which no pair of ranks can block each other. This
          // rank's own block moves no data between ranks: a device copy on the same stream,
          // ordered before the group, instead of a NCCL send to itself.
          if (req.block_count(rank_) > 0)
            LMSCALE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(req.recv) + req.recv_block_offset(rank_) * es,
                                               static_cast<const char*>(req.send) + req.block_offset(rank_) * es,
                                               req.block_count(rank_) * es, cudaMemcpyDeviceToDevice, s));
          shared_->check(ncclGroupStart(), "all-to-all (ncclGroupStart)");
          for (int q = 0; q < size_; ++q) {
            if (q == rank_) continue;
            if (req.block_count(q) > 0)
              shared_->check(ncclSend(static_cast<const char*>(req.send) + req.block_offset(q) * es,
                                      req.block_count(q), type, q, comm, s), "all-to-all (ncclSend)");
            if (req.recv_block_count(q) > 0)
              shared_->check(ncclRecv(static_cast<char*>(req.recv) + req.recv_block_offset(q) * es,
                                      req.recv_block_count(q), type, q, comm, s), "all-to-all (ncclRecv)");
          }
          shared_->check(ncclGroupEnd(), "all-to-all (ncclGroupEnd)");
          return;
        case OpKind::barrier:
          break;
      }
      throw Error(fmt::format("nccl: unexpected {}", what));
    });
  }

 private:
  // Point-to-point ops go on their own trace track: several may be in flight together.
  static bool is_p2p(const char* what) {
    const std::string_view w(what);
    return w == "send" || w == "recv" || w == "sendrecv" || w == "exchange";
  }

  // Orders the communication stream after the compute stream, enqueues, records completion.
  template <class F>
  Work launch(const char* what, std::size_t bytes, F&& enqueue) {
    LMSCALE_CUDA_CHECK(cudaSetDevice(shared_->device));
    cudaEvent_t ready = shared_->events.get();
    LMSCALE_CUDA_CHECK(cudaEventRecord(ready, compute_));
    LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(shared_->stream, ready, 0));
    shared_->events.put(ready);   // the wait captured the recorded state; the event may be reused
    // run.trace: the op as the comm stream runs it (timing events around the enqueue), on the comm
    // track; the host's issue time goes in its args. Resolved after the step (core/trace.h).
    trace::Recorder* rec = trace::active();
    const int token = rec ? rec->device_begin(shared_->stream) : -1;
    const double issued = rec ? rec->now_us() : 0;
    enqueue(shared_->stream);
    if (rec)
      rec->device_end(token, what, is_p2p(what) ? trace::kCommP2P : trace::kComm,
                      fmt::format("\"bytes\":{},\"issued_us\":{:.3f}", bytes, issued), shared_->stream);
    cudaEvent_t done = shared_->events.get();
    LMSCALE_CUDA_CHECK(cudaEventRecord(done, shared_->stream));
    return Work(std::make_shared<NcclWork>(shared_, done, compute_, what));
  }

  void verify(const Request& req) {
    const detail::Descriptor d = detail::describe_call(req, Algo::library, size_);
    std::vector<detail::Descriptor> all(static_cast<std::size_t>(size_));
    LMSCALE_MPI_CHECK(MPI_Allgather(d.data(), static_cast<int>(d.size()), MPI_INT64_T, all.data(),
                                    static_cast<int>(d.size()), MPI_INT64_T, mpi_),
                      rank_);
    detail::verify_descriptors(all);
    if (req.kind == OpKind::all_to_all && req.uneven()) {
      // Pairwise block sizes over MPI (as the mpi backend does), one flag for all ranks.
      std::vector<std::int64_t> mine(req.counts.begin(), req.counts.end()), to_me(mine.size());
      LMSCALE_MPI_CHECK(MPI_Alltoall(mine.data(), 1, MPI_INT64_T, to_me.data(), 1, MPI_INT64_T, mpi_), rank_);
      const std::string bad = detail::all_to_all_count_errors(req, to_me, rank_);
      int local = bad.empty() ? 0 : 1, any = 0;
      LMSCALE_MPI_CHECK(MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, mpi_), rank_);
      if (any != 0)
        throw detail::MismatchError("collective mismatch between ranks (check mode): all-to-all block sizes differ" +
                                    (bad.empty() ? std::string(" on another rank") : bad));
    }
  }

  MPI_Comm mpi_;
  int rank_ = 0, size_ = 1;
  int max_ctas_ = 0;   // NcclOptions::max_ctas, passed on to split() children
  Algo algo_ = Algo::automatic;
  cudaStream_t compute_ = cudaStreamLegacy;
  std::shared_ptr<NcclShared> shared_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int cuda_device, NcclOptions options) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);   // NVLink multicast stays off (docs/architecture.md §3)
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  LMSCALE_MPI_CHECK(MPI_Comm_dup(comm, &mpi), rank);
  MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
  MPI_Comm_size(mpi, &size);

  // Agree that every rank has its GPU before NCCL init, which would otherwise hang on the others.
  int devices = 0;
  const bool have = cudaGetDeviceCount(&devices) == cudaSuccess && cuda_device >= 0 && cuda_device < devices &&
                    cudaSetDevice(cuda_device) == cudaSuccess;
  int ok = have ? 1 : 0, all_ok = 0;
  LMSCALE_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, mpi), rank);
  if (!all_ok) {
    MPI_Comm_free(&mpi);
    throw Error(fmt::format("nccl: rank {} {} CUDA device {} ({} visible); run one rank per GPU", rank,
                            have ? "has its" : "cannot use", cuda_device, devices));
  }

  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw Error(fmt::format("nccl ncclGetUniqueId failed on rank 0: {}", ncclGetErrorString(r)));
  }
  LMSCALE_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi), rank);
  // Non-blocking (see wait_ready): the init returns at once; its state is polled until ready.
  ncclConfig_t config = nonblocking_config(options.max_ctas);
  ncclComm_t nc = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&nc, size, id, rank, &config);
  if (r == ncclInProgress && nc) r = wait_ready(nc, r);
  if (r != ncclSuccess) {
    const std::string detail = nc ? ncclGetLastError(nc) : "";
    if (nc) ncclCommAbort(nc);
    throw Error(fmt::format("nccl ncclCommInitRankConfig failed on rank {}/{} (cuda device {}): {}: {}", rank, size,
                            cuda_device, ncclGetErrorString(r), detail));
  }
  return std::make_unique<NcclCommunicator>(mpi, nc, cuda_device, options);
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace lmscale::comm
