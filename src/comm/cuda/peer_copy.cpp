// Copy-engine transfers between the GPUs of one node (comm/peer_copy.h): a receive window per
// rank shared through CUDA IPC, peer-to-peer copies on a copy stream, host barriers between rounds.
#include "lmscale/comm/peer_copy.h"

#include <mpi.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/error.h"
#include "lmscale/core/trace.h"

namespace lmscale::comm {

namespace {

constexpr const char* kTag = "grad_exchange_window";
// The handle, then the window's byte offset in the allocation the handle names (two ints).
constexpr std::size_t kHandleInts = (sizeof(cudaIpcMemHandle_t) + 3) / 4 + 2;
// cudaMalloc serves small requests from shared 2 MiB chunks; a window of whole 2 MiB units is
// an allocation of its own, so the handle maps exactly it.
constexpr std::size_t kWindowUnit = std::size_t{2} << 20;

// The start of the cudaMalloc allocation holding `p` (cuMemGetAddressRange through the runtime's
// driver entry point: the library does not link libcuda itself).
char* allocation_base(void* p) {
  static const PFN_cuMemGetAddressRange_v3020 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    LMSCALE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &ptr, 3020, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw Error("peer copy: the driver has no cuMemGetAddressRange");
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(ptr);
  }();
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (fn(&base, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
    throw Error("peer copy: cuMemGetAddressRange failed on the receive window");
  return reinterpret_cast<char*>(base);
}

class CudaPeerCopyExchange final : public PeerCopyExchange {
 public:
  CudaPeerCopyExchange(Communicator& host, std::size_t slot_bytes, MemoryTracker* tracker)
      : host_(host), rank_(host.rank()), size_(host.size()), slot_bytes_(slot_bytes), tracker_(tracker) {
    LMSCALE_CUDA_CHECK(cudaGetDevice(&device_));
    check_one_node();
    window_bytes_ = static_cast<std::size_t>(size_ - 1) * slot_bytes_;
    // cudaMalloc'd on its own (not from the caching allocator): an IPC handle names a whole
    // allocation. Whole 2 MiB units (at least one, so every rank has a handle to share); the
    // tracker counts the bytes the slots need, as the memory model does.
    const std::size_t reserve = (std::max<std::size_t>(window_bytes_, 1) + kWindowUnit - 1) / kWindowUnit * kWindowUnit;
    LMSCALE_CUDA_CHECK(cudaMalloc(&window_, reserve));
    if (tracker_) tracker_->on_alloc(window_bytes_, kTag);
    // The handle names the allocation that holds the window; peers add the window's offset in it.
    char* base = allocation_base(window_);
    const std::uint64_t offset = static_cast<std::uint64_t>(static_cast<char*>(window_) - base);
    cudaIpcMemHandle_t mine{};
    LMSCALE_CUDA_CHECK(cudaIpcGetMemHandle(&mine, base));
    std::array<std::int32_t, kHandleInts> packed{};
    std::memcpy(packed.data(), &mine, sizeof(mine));
    std::memcpy(packed.data() + kHandleInts - 2, &offset, sizeof(offset));
    std::vector<std::int32_t> all(kHandleInts * static_cast<std::size_t>(size_));
    host_.all_gather(packed.data(), all.data(), kHandleInts, DType::i32).wait();
    peers_.assign(static_cast<std::size_t>(size_), nullptr);
    mapped_.assign(static_cast<std::size_t>(size_), nullptr);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      cudaIpcMemHandle_t h{};
      std::uint64_t at = 0;
      std::memcpy(&h, all.data() + kHandleInts * static_cast<std::size_t>(q), sizeof(h));
      std::memcpy(&at, all.data() + kHandleInts * static_cast<std::size_t>(q + 1) - 2, sizeof(at));
      const cudaError_t e = cudaIpcOpenMemHandle(&mapped_[static_cast<std::size_t>(q)], h, cudaIpcMemLazyEnablePeerAccess);
      if (e == cudaSuccess) peers_[static_cast<std::size_t>(q)] = static_cast<char*>(mapped_[static_cast<std::size_t>(q)]) + at;
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
  std::size_t bytes_put() const override { return bytes_put_; }

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
    bytes_put_ += bytes;
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

  void check_one_node() {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    const std::int64_t h = static_cast<std::int64_t>(std::hash<std::string>{}(std::string(name, static_cast<std::size_t>(len))));
    std::vector<std::int64_t> all(static_cast<std::size_t>(size_));
    host_.all_gather(&h, all.data(), 1, DType::i64).wait();
    for (int q = 0; q < size_; ++q)
      if (all[static_cast<std::size_t>(q)] != h)
        throw UsageError(fmt::format(
            "parallel.grad_exchange = copy-engine: rank {} runs on another node than rank {} ({}); copy-engine "
            "transfers need the data-parallel ranks on one node; use parallel.grad_exchange = nccl",
            q, rank_, name));
  }

  void release() {
    for (void*& p : mapped_)
      if (p) {
        cudaIpcCloseMemHandle(p);
        p = nullptr;
      }
    peers_.assign(peers_.size(), nullptr);
    if (window_) {
      cudaFree(window_);
      if (tracker_) tracker_->on_free(window_bytes_, kTag);
      window_ = nullptr;
    }
  }

  Communicator& host_;
  int rank_, size_, device_ = 0;
  std::size_t slot_bytes_, window_bytes_ = 0, bytes_put_ = 0;
  MemoryTracker* tracker_;
  void* window_ = nullptr;
  std::vector<void*> mapped_;   // rank q's allocation as cudaIpcOpenMemHandle mapped it (null for this rank)
  std::vector<void*> peers_;    // rank q's window in that mapping
  cudaStream_t copy_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr, consumed_ = nullptr;
  bool open_ = false, consumed_recorded_ = false;
};

}  // namespace

std::unique_ptr<PeerCopyExchange> make_peer_copy_exchange(Communicator& host, std::size_t slot_bytes,
                                                          MemoryTracker* tracker) {
  LMSCALE_CHECK(host.device() == Device::cpu, "peer copy: the handles and barriers go over a host communicator");
  return std::make_unique<CudaPeerCopyExchange>(host, slot_bytes, tracker);
}

}  // namespace lmscale::comm
