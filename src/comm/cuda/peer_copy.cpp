// Copy-engine transfers between the GPUs of one node (comm/peer_copy.h): a receive window per
// rank shared through CUDA IPC, peer-to-peer copies on two copy streams, host barriers or device
// signals (stream memory operations on flags in the windows) between rounds.
#include "lmscale/comm/peer_copy.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lmscale/comm/mpi_communicator.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "lmscale/core/trace.h"

namespace lmscale::comm {

namespace {

constexpr std::size_t kHandleInts = (sizeof(cudaIpcMemHandle_t) + 3) / 4;
constexpr int kLanes = 2;

// The driver's stream memory operations and address query, through the runtime's entry points:
// lmscale links only the runtime (libcuda is loaded by it), so that a build runs where no driver
// is installed (CI) as long as no GPU path is taken.
struct DriverCalls {
  PFN_cuStreamWriteValue64_v11070 write64 = nullptr;
  PFN_cuStreamWaitValue64_v11070 wait64 = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
};

template <class F>
void entry_point(const char* name, F& fn) {
  cudaDriverEntryPointQueryResult q{};
  void* p = nullptr;
  LMSCALE_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
  LMSCALE_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr, "peer copy: the CUDA driver has no {}", name);
  fn = reinterpret_cast<F>(p);
}

void check_driver(CUresult r, const char* what) {
  LMSCALE_CHECK(r == CUDA_SUCCESS, "peer copy: {} failed (CUresult {})", what, static_cast<int>(r));
}

class CudaPeerCopyExchange final : public PeerCopyExchange {
 public:
  CudaPeerCopyExchange(Communicator& host, std::size_t slot_bytes, MemoryTracker* tracker, int flags_per_sender,
                       const PeerCopyUser& user)
      : host_(host), rank_(host.rank()), size_(host.size()), slot_bytes_(slot_bytes), flags_(flags_per_sender),
        tracker_(tracker), user_(user) {
    LMSCALE_CUDA_CHECK(cudaGetDevice(&device_));
    LMSCALE_CHECK(flags_ >= 1, "peer copy: a window needs at least one signal flag per sender");
    check_one_node();
    load_driver_calls();
    window_bytes_ = peer_copy_window_bytes(size_, slot_bytes_, flags_);
    flags_at_ = (static_cast<std::size_t>(size_ - 1) * slot_bytes_ + 7) / 8 * 8;
    // cudaMalloc'd on its own (not from the caching allocator): an IPC handle names a whole
    // allocation. At least one byte, so that every rank has a handle to share.
    LMSCALE_CUDA_CHECK(cudaMalloc(&window_, std::max<std::size_t>(window_bytes_, 256)));
    if (tracker_) tracker_->on_alloc(window_bytes_, user_.tag);
    // Zero the flags before any rank can signal: the handles' all-gather below orders it for the others.
    LMSCALE_CUDA_CHECK(cudaMemset(static_cast<char*>(window_) + flags_at_, 0, window_bytes_ - flags_at_));
    LMSCALE_CUDA_CHECK(cudaDeviceSynchronize());
    try {
      buffers_.push_back(open_peers(window_));
    } catch (...) {
      release();
      throw;
    }
    int lo = 0, hi = 0;
    LMSCALE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    for (cudaStream_t& c : copy_) LMSCALE_CUDA_CHECK(cudaStreamCreateWithPriority(&c, cudaStreamNonBlocking, lo));
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    for (cudaEvent_t& e : done_) LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&consumed_, cudaEventDisableTiming));
  }

  ~CudaPeerCopyExchange() override {
    cudaSetDevice(device_);
    for (cudaStream_t c : copy_)
      if (c) cudaStreamSynchronize(c);
    if (consumed_ && consumed_recorded_) cudaEventSynchronize(consumed_);
    release();
    for (cudaEvent_t e : {ready_, done_[0], done_[1], consumed_})
      if (e) cudaEventDestroy(e);
    for (cudaStream_t c : copy_)
      if (c) cudaStreamDestroy(c);
  }

  void* slot(int sender) override {
    LMSCALE_CHECK(sender != rank_ && sender >= 0 && sender < size_, "peer copy: no slot for sender {} on rank {}",
                  sender, rank_);
    return static_cast<char*>(window_) + slot_index(sender, rank_) * slot_bytes_;
  }

  void begin() override {
    LMSCALE_CHECK(!open_, "peer copy: begin() twice without drain()");
    // This rank's reads of its window in the previous round are done before anyone writes again.
    if (consumed_recorded_) LMSCALE_CUDA_CHECK(cudaEventSynchronize(consumed_));
    host_.barrier();
    open_ = true;
  }

  void put(int to, int buffer, std::size_t offset, const void* src, std::size_t bytes, void* after,
           int lane) override {
    LMSCALE_CHECK(to != rank_ && to >= 0 && to < size_, "peer copy: cannot put to rank {} from rank {}", to, rank_);
    LMSCALE_CHECK(buffer >= 0 && buffer < static_cast<int>(buffers_.size()), "peer copy: no shared buffer {}", buffer);
    LMSCALE_CHECK(lane >= 0 && lane < kLanes, "peer copy: no lane {}", lane);
    const Shared& b = buffers_[static_cast<std::size_t>(buffer)];
    const std::size_t limit = buffer == kWindow ? slot_bytes_ : b.bytes;
    LMSCALE_CHECK(offset + bytes <= limit, "peer copy: {} bytes at {} exceed the {}-byte target", bytes, offset, limit);
    if (bytes == 0) return;
    cudaStream_t copy = copy_[lane];
    if (after) {
      LMSCALE_CUDA_CHECK(cudaEventRecord(ready_, static_cast<cudaStream_t>(after)));
      LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(copy, ready_, 0));
    }
    char* dst = static_cast<char*>(b.peers[static_cast<std::size_t>(to)]) + offset +
                (buffer == kWindow ? slot_index(rank_, to) * slot_bytes_ : 0);
    // run.trace: the copy as the copy stream runs it, on the point-to-point track (core/trace.h).
    trace::Recorder* rec = trace::active();
    const int token = rec ? rec->device_begin(copy) : -1;
    const double issued = rec ? rec->now_us() : 0;
    LMSCALE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy));
    if (rec)
      rec->device_end(token, fmt::format("peer copy to {}", to), trace::kCommP2P,
                      fmt::format("\"bytes\":{},\"issued_us\":{:.3f}", bytes, issued), copy);
  }

  int share(void* base, std::size_t bytes) override {
    // An IPC handle maps the whole allocation: `base` must be where it starts.
    CUdeviceptr start = 0;
    std::size_t size = 0;
    if (!drv_.address_range) entry_point("cuMemGetAddressRange", drv_.address_range);
    check_driver(drv_.address_range(&start, &size, reinterpret_cast<CUdeviceptr>(base)), "cuMemGetAddressRange");
    LMSCALE_CHECK(start == reinterpret_cast<CUdeviceptr>(base) && size >= bytes,
                  "peer copy: a shared buffer must start its allocation ({} bytes at {} lie in {} bytes at {:#x})",
                  bytes, base, size, static_cast<unsigned long long>(start));
    Shared s = open_peers(base);
    s.bytes = bytes;
    buffers_.push_back(std::move(s));
    return static_cast<int>(buffers_.size()) - 1;
  }

  void signal(int to, int index, std::uint64_t value, int lane) override {
    LMSCALE_CHECK(lane >= 0 && lane < kLanes, "peer copy: no lane {}", lane);
    write_flag(to, index, value, copy_[lane]);
  }

  void signal_after(int to, int index, std::uint64_t value, void* stream) override {
    write_flag(to, index, value, static_cast<cudaStream_t>(stream));
  }

  void wait(int from, int index, std::uint64_t value, void* stream) override {
    wait_flag(from, index, value, static_cast<cudaStream_t>(stream));
  }

  void lane_wait(int from, int index, std::uint64_t value, int lane) override {
    LMSCALE_CHECK(lane >= 0 && lane < kLanes, "peer copy: no lane {}", lane);
    wait_flag(from, index, value, copy_[lane]);
  }

  void drain(void* stream) override {
    open_ = false;
    for (int l = 0; l < kLanes; ++l) {
      LMSCALE_CUDA_CHECK(cudaEventRecord(done_[l], copy_[l]));
      LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_[l], 0));
    }
  }

  void consumed(void* stream) override {
    LMSCALE_CUDA_CHECK(cudaEventRecord(consumed_, static_cast<cudaStream_t>(stream)));
    consumed_recorded_ = true;
  }

 private:
  // Flag `index` that rank `to` keeps for this rank := value, on `stream` after its earlier work.
  void write_flag(int to, int index, std::uint64_t value, cudaStream_t stream) {
    LMSCALE_CHECK(index >= 0 && index < flags_ && to != rank_ && to >= 0 && to < size_,
                  "peer copy: no flag {} from rank {} at rank {}", index, rank_, to);
    auto* peer = static_cast<char*>(buffers_[kWindow].peers[static_cast<std::size_t>(to)]);
    // CU_STREAM_WRITE_VALUE_DEFAULT: fenced after the stream's earlier copies (comm/peer_copy.h).
    check_driver(drv_.write64(stream, reinterpret_cast<CUdeviceptr>(peer + flag_offset(rank_, index)), value,
                              CU_STREAM_WRITE_VALUE_DEFAULT),
                 "cuStreamWriteValue64");
  }
  // `stream` holds until this rank's flag `index` from `from` is >= value.
  void wait_flag(int from, int index, std::uint64_t value, cudaStream_t stream) {
    LMSCALE_CHECK(index >= 0 && index < flags_ && from != rank_ && from >= 0 && from < size_,
                  "peer copy: no flag {} from rank {} at rank {}", index, from, rank_);
    auto* mine = static_cast<char*>(window_) + flag_offset(from, index);
    // Where the platform can, also flush the remote writes that arrived before the flag: the
    // device may otherwise reorder a peer's writes (cuda.h, CU_STREAM_WAIT_VALUE_FLUSH). Over
    // NVLink peer copies the copy's fence before the flag has been enough in every test so far.
    check_driver(drv_.wait64(stream, reinterpret_cast<CUdeviceptr>(mine), value,
                             static_cast<unsigned>(CU_STREAM_WAIT_VALUE_GEQ) |
                                 (flush_ ? static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH) : 0u)),
                 "cuStreamWaitValue64");
  }

  // Receiver r keeps one slot per other rank, in rank order without itself.
  std::size_t slot_index(int sender, int receiver) const {
    return static_cast<std::size_t>(sender < receiver ? sender : sender - 1);
  }
  // Byte offset in a window of the flag `index` its owner keeps for `sender`.
  std::size_t flag_offset(int sender, int index) const {
    return flags_at_ + (static_cast<std::size_t>(sender) * static_cast<std::size_t>(flags_) +
                        static_cast<std::size_t>(index)) * 8;
  }

  struct Shared {
    std::vector<void*> peers;   // rank q's buffer, mapped here (null for this rank)
    std::size_t bytes = 0;
  };
  // Collective: every rank's `base` mapped into this process.
  Shared open_peers(void* base) {
    cudaIpcMemHandle_t mine{};
    LMSCALE_CUDA_CHECK(cudaIpcGetMemHandle(&mine, base));
    std::array<std::int32_t, kHandleInts> packed{};
    std::memcpy(packed.data(), &mine, sizeof(mine));
    std::vector<std::int32_t> all(kHandleInts * static_cast<std::size_t>(size_));
    host_.all_gather(packed.data(), all.data(), kHandleInts, DType::i32).wait();
    Shared s;
    s.peers.assign(static_cast<std::size_t>(size_), nullptr);
    std::string failed;   // this rank's first failure
    for (int q = 0; q < size_ && failed.empty(); ++q) {
      if (q == rank_) continue;
      cudaIpcMemHandle_t h{};
      std::memcpy(&h, all.data() + kHandleInts * static_cast<std::size_t>(q), sizeof(h));
      const cudaError_t e = cudaIpcOpenMemHandle(&s.peers[static_cast<std::size_t>(q)], h, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        cudaGetLastError();
        s.peers[static_cast<std::size_t>(q)] = nullptr;
        failed = fmt::format("rank {} (cuda device {}) cannot map rank {}'s GPU memory ({})", rank_, device_, q,
                             cudaGetErrorString(e));
      }
    }
    // Every rank learns of a failure anywhere, so that none goes on to the next collective alone.
    std::int32_t local_failure = failed.empty() ? 0 : 1, any = 0;
    host_.all_reduce(&local_failure, &any, 1, DType::i32, ReduceOp::max).wait();
    if (any) {
      close(s);
      throw UsageError(fmt::format(
          "{} = copy-engine: {}; the {} GPUs need peer access (NVLink or PCIe P2P); use {} = nccl", user_.key,
          failed.empty() ? "another rank cannot map a peer's GPU memory" : failed, user_.group, user_.key));
    }
    return s;
  }
  static void close(Shared& s) {
    for (void*& p : s.peers)
      if (p) {
        cudaIpcCloseMemHandle(p);
        p = nullptr;
      }
  }

  void load_driver_calls() {
    entry_point("cuStreamWriteValue64", drv_.write64);
    entry_point("cuStreamWaitValue64", drv_.wait64);
    entry_point("cuDeviceGetAttribute", drv_.attribute);
    int ok = 0, flush = 0;
    // (A CUdevice is the device's ordinal, as the runtime numbers it.)
    check_driver(drv_.attribute(&ok, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device_), "cuDeviceGetAttribute");
    check_driver(drv_.attribute(&flush, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, device_), "cuDeviceGetAttribute");
    flush_ = flush != 0;
    if (!ok)
      throw UsageError(fmt::format(
          "{} = copy-engine: cuda device {} cannot run 64-bit stream memory operations, which the exchange "
          "signals with; use {} = nccl",
          user_.key, device_, user_.key));
  }

  // The communicator knows whether its ranks share a node (MPI_COMM_TYPE_SHARED).
  void check_one_node() {
    const auto* mpi = dynamic_cast<const MpiCommunicator*>(&host_);
    LMSCALE_CHECK(mpi != nullptr, "peer copy: the handles and barriers go over an mpi host communicator");
    if (!mpi->node_local())
      throw UsageError(fmt::format(
          "{} = copy-engine: the {} ranks are on {} nodes; copy-engine transfers need them on one node; use {} = "
          "nccl",
          user_.key, user_.group, mpi->nodes(), user_.key));
  }

  void release() {
    for (Shared& b : buffers_) close(b);
    buffers_.clear();
    if (window_) {
      cudaFree(window_);
      if (tracker_) tracker_->on_free(window_bytes_, user_.tag);
      window_ = nullptr;
    }
  }

  Communicator& host_;
  int rank_, size_, device_ = 0;
  std::size_t slot_bytes_, window_bytes_ = 0, flags_at_ = 0;
  int flags_;   // per sender
  bool flush_ = false;   // waits also flush remote writes (CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES)
  MemoryTracker* tracker_;
  PeerCopyUser user_;   // the key its errors name, the tracker's tag
  void* window_ = nullptr;
  std::vector<Shared> buffers_;   // [kWindow]: the windows; then share()'s buffers
  DriverCalls drv_;
  cudaStream_t copy_[kLanes] = {};
  cudaEvent_t ready_ = nullptr, done_[kLanes] = {}, consumed_ = nullptr;
  bool open_ = false, consumed_recorded_ = false;
};

}  // namespace

std::unique_ptr<PeerCopyExchange> make_peer_copy_exchange(Communicator& host, std::size_t slot_bytes,
                                                          MemoryTracker* tracker, int flags_per_sender,
                                                          const PeerCopyUser& user) {
  return std::make_unique<CudaPeerCopyExchange>(host, slot_bytes, tracker, flags_per_sender, user);
}

}  // namespace lmscale::comm
