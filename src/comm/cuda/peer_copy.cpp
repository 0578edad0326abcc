// Copy-engine transfers between the GPUs of one node (comm/peer_copy.h): a receive window per
// rank shared through CUDA IPC, peer-to-peer copies on a copy stream, host barriers between rounds.
#include "lmscale/comm/peer_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lmscale/comm/mpi_communicator.h"
#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "lmscale/core/trace.h"

namespace lmscale::comm {

namespace {

constexpr const char* kTag = "grad_exchange_window";
constexpr std::size_t kHandleInts = (sizeof(cudaIpcMemHandle_t) + 3) / 4;

class CudaPeerCopyExchange final : public PeerCopyExchange {
 public:
  CudaPeerCopyExchange(Communicator& host, std::size_t slot_bytes, MemoryTracker* tracker)
      : host_(host), rank_(host.rank()), size_(host.size()), slot_bytes_(slot_bytes), tracker_(tracker) {
    LMSCALE_CUDA_CHECK(cudaGetDevice(&device_));
    check_one_node();
    window_bytes_ = static_cast<std::size_t>(size_ - 1) * slot_bytes_;
    // cudaMalloc'd on its own (not from the caching allocator): an IPC handle names a whole
    // allocation. At least one byte, so that every rank has a handle to share.
    LMSCALE_CUDA_CHECK(cudaMalloc(&window_, std::max<std::size_t>(window_bytes_, 256)));
    if (tracker_) tracker_->on_alloc(window_bytes_, kTag);
    cudaIpcMemHandle_t mine{};
    LMSCALE_CUDA_CHECK(cudaIpcGetMemHandle(&mine, window_));
    std::array<std::int32_t, kHandleInts> packed{};
    std::memcpy(packed.data(), &mine, sizeof(mine));
    std::vector<std::int32_t> all(kHandleInts * static_cast<std::size_t>(size_));
    host_.all_gather(packed.data(), all.data(), kHandleInts, DType::i32).wait();
    peers_.assign(static_cast<std::size_t>(size_), nullptr);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      cudaIpcMemHandle_t h{};
      std::memcpy(&h, all.data() + kHandleInts * static_cast<std::size_t>(q), sizeof(h));
      const cudaError_t e = cudaIpcOpenMemHandle(&peers_[static_cast<std::size_t>(q)], h, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        cudaGetLastError();
        release();
        throw UsageError(fmt::format(
            "parallel.grad_exchange = copy-engine: rank {} (cuda device {}) cannot map rank {}'s GPU memory ({}); the "
            "data-parallel GPUs need peer access (NVLink or PCIe P2P); use parallel.grad_exchange = nccl",
            rank_, device_, q, cudaGetErrorString(e)));
      }
    }
    int lo = 0, hi = 0;
    LMSCALE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    LMSCALE_CUDA_CHECK(cudaStreamCreateWithPriority(&copy_, cudaStreamNonBlocking, lo));
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&consumed_, cudaEventDisableTiming));
  }

  ~CudaPeerCopyExchange() override {
    cudaSetDevice(device_);
    if (copy_) cudaStreamSynchronize(copy_);
    if (consumed_ && consumed_recorded_) cudaEventSynchronize(consumed_);
    release();
    for (cudaEvent_t e : {ready_, done_, consumed_})
      if (e) cudaEventDestroy(e);
    if (copy_) cudaStreamDestroy(copy_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::size_t slot_bytes() const override { return slot_bytes_; }

  void* slot(int sender) override {
    LMSCALE_CHECK(sender != rank_ && sender >= 0 && sender < size_, "peer copy: no slot for sender {} on rank {}",
                  sender, rank_);
    return static_cast<char*>(window_) + slot_index(sender, rank_) * slot_bytes_;
  }

  void begin() override {
    LMSCALE_CHECK(!open_, "peer copy: begin() twice without complete()");
    // This rank's reads of its window in the previous round are done before anyone writes again.
    if (consumed_recorded_) LMSCALE_CUDA_CHECK(cudaEventSynchronize(consumed_));
    host_.barrier();
    open_ = true;
  }

  void put(int to, std::size_t offset, const void* src, std::size_t bytes, void* after) override {
    LMSCALE_CHECK(open_, "peer copy: put() outside begin() ... complete()");
    LMSCALE_CHECK(to != rank_ && to >= 0 && to < size_, "peer copy: cannot put to rank {} from rank {}", to, rank_);
    LMSCALE_CHECK(offset + bytes <= slot_bytes_, "peer copy: {} bytes at {} exceed the {}-byte slot", bytes, offset,
                  slot_bytes_);
    if (bytes == 0) return;
    LMSCALE_CUDA_CHECK(cudaEventRecord(ready_, static_cast<cudaStream_t>(after)));
    LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(copy_, ready_, 0));
    char* dst = static_cast<char*>(peers_[static_cast<std::size_t>(to)]) + slot_index(rank_, to) * slot_bytes_ + offset;
    // run.trace: the copy as the copy stream runs it, on the point-to-point track (core/trace.h).
    trace::Recorder* rec = trace::active();
    const int token = rec ? rec->device_begin(copy_) : -1;
    const double issued = rec ? rec->now_us() : 0;
    LMSCALE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_));
    if (rec)
      rec->device_end(token, fmt::format("peer copy to {}", to), trace::kCommP2P,
                      fmt::format("\"bytes\":{},\"issued_us\":{:.3f}", bytes, issued), copy_);
  }

  void complete(void* stream) override {
    LMSCALE_CHECK(open_, "peer copy: complete() without begin()");
    open_ = false;
    LMSCALE_CUDA_CHECK(cudaEventRecord(done_, copy_));
    // The host waits for this rank's copies; after the barrier every rank's have landed.
    LMSCALE_CUDA_CHECK(cudaEventSynchronize(done_));
    host_.barrier();
    LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0));
  }

  void consumed(void* stream) override {
    LMSCALE_CUDA_CHECK(cudaEventRecord(consumed_, static_cast<cudaStream_t>(stream)));
    consumed_recorded_ = true;
  }

 private:
  // Receiver r keeps one slot per other rank, in rank order without itself.
  std::size_t slot_index(int sender, int receiver) const {
    return static_cast<std::size_t>(sender < receiver ? sender : sender - 1);
  }

  // The communicator knows whether its ranks share a node (MPI_COMM_TYPE_SHARED).
  void check_one_node() {
    const auto* mpi = dynamic_cast<const MpiCommunicator*>(&host_);
    LMSCALE_CHECK(mpi != nullptr, "peer copy: the handles and barriers go over an mpi host communicator");
    if (!mpi->node_local())
      throw UsageError(fmt::format(
          "parallel.grad_exchange = copy-engine: the data-parallel ranks are on {} nodes; copy-engine transfers need "
          "them on one node; use parallel.grad_exchange = nccl",
          mpi->nodes()));
  }

  void release() {
    for (void*& p : peers_)
      if (p) {
        cudaIpcCloseMemHandle(p);
        p = nullptr;
      }
    if (window_) {
      cudaFree(window_);
      if (tracker_) tracker_->on_free(window_bytes_, kTag);
      window_ = nullptr;
    }
  }

  Communicator& host_;
  int rank_, size_, device_ = 0;
  std::size_t slot_bytes_, window_bytes_ = 0;
  MemoryTracker* tracker_;
  void* window_ = nullptr;
  std::vector<void*> peers_;   // rank q's window, mapped here (null for this rank)
  cudaStream_t copy_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr, consumed_ = nullptr;
  bool open_ = false, consumed_recorded_ = false;
};

}  // namespace

std::unique_ptr<PeerCopyExchange> make_peer_copy_exchange(Communicator& host, std::size_t slot_bytes,
                                                          MemoryTracker* tracker) {
  return std::make_unique<CudaPeerCopyExchange>(host, slot_bytes, tracker);
}

}  // namespace lmscale::comm
