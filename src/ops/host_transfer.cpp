#include "lmscale/ops/host_transfer.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "lmscale/core/error.h"

#ifdef LMSCALE_WITH_CUDA
#include "lmscale/core/cuda/cuda_check.h"
#endif

namespace lmscale::ops {

#ifdef LMSCALE_WITH_CUDA
namespace {
// Page-locked host memory. cudaHostAlloc maps it for every device (portable), so a copy on any
// stream of the process can use it at full bus speed.
class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, const char* tag) override {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      throw OutOfMemory(fmt::format("out of pinned host memory: allocating {} bytes ({:.2f} GiB) for '{}' failed "
                                    "({:.2f} GiB pinned by this rank already)",
                                    bytes, static_cast<double>(bytes) / (1ull << 30), tag,
                                    static_cast<double>(tracker_.current()) / (1ull << 30)),
                        bytes, tracker_.current());
    }
    tracker_.on_alloc(bytes, tag);
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes, const char* tag) override {
    if (!ptr) return;
    cudaFreeHost(ptr);
    tracker_.on_free(bytes, tag);
  }
  Device device() const override { return Device::cpu; }
};
}  // namespace

struct HostTransfer::Lane {
  int device = 0;
  cudaStream_t stream = nullptr;
  PinnedHostAllocator pinned;
  std::mutex pool_mutex;   // fences are released on any thread
  std::shared_ptr<std::vector<cudaEvent_t>> pool = std::make_shared<std::vector<cudaEvent_t>>();

  Fence record(cudaStream_t on) {
    cudaEvent_t e;
    {
      std::lock_guard<std::mutex> lock(pool_mutex);
      if (pool->empty()) {
        LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      } else {
        e = pool->back();
        pool->pop_back();
      }
    }
    LMSCALE_CUDA_CHECK(cudaEventRecord(e, on));
    std::weak_ptr<std::vector<cudaEvent_t>> weak = pool;
    return Fence{std::shared_ptr<void>(e, [this, weak](void* p) {
      if (auto v = weak.lock()) {
        std::lock_guard<std::mutex> lock(pool_mutex);
        v->push_back(static_cast<cudaEvent_t>(p));
      } else {
        cudaEventDestroy(static_cast<cudaEvent_t>(p));
      }
    })};
  }
};
#else
struct HostTransfer::Lane {};
#endif

HostTransfer::HostTransfer(Runtime& rt) : rt_(rt) {
#ifdef LMSCALE_WITH_CUDA
  if (rt.device() == Device::cuda) {
    lane_ = std::make_unique<Lane>();
    LMSCALE_CUDA_CHECK(cudaGetDevice(&lane_->device));
    int least = 0, greatest = 0;
    LMSCALE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    LMSCALE_CUDA_CHECK(cudaStreamCreateWithPriority(&lane_->stream, cudaStreamNonBlocking, least));
  }
#endif
}

HostTransfer::~HostTransfer() {
#ifdef LMSCALE_WITH_CUDA
  if (lane_) {
    cudaStreamSynchronize(lane_->stream);
    cudaStreamDestroy(lane_->stream);
    std::lock_guard<std::mutex> lock(lane_->pool_mutex);
    for (cudaEvent_t e : *lane_->pool) cudaEventDestroy(e);
    lane_->pool->clear();
  }
#endif
}

Allocator& HostTransfer::pinned() {
#ifdef LMSCALE_WITH_CUDA
  if (lane_) return lane_->pinned;
#endif
  return rt_.host();
}

void HostTransfer::bind_thread() {
#ifdef LMSCALE_WITH_CUDA
  if (lane_) LMSCALE_CUDA_CHECK(cudaSetDevice(lane_->device));
#endif
}

HostTransfer::Fence HostTransfer::fence() {
#ifdef LMSCALE_WITH_CUDA
  if (lane_) return lane_->record(lane_->stream);
#endif
  return {};
}

HostTransfer::Fence HostTransfer::fence(Context& ctx) {
#ifdef LMSCALE_WITH_CUDA
  if (lane_) return lane_->record(static_cast<cudaStream_t>(ctx.stream));
#endif
  (void)ctx;
  return {};
}

void HostTransfer::copy(const Tensor& src, Tensor& dst) {
  LMSCALE_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), "HostTransfer::copy: {} {} into {} {}",
                dtype_name(src.dtype()), src.numel(), dtype_name(dst.dtype()), dst.numel());
  if (src.nbytes() == 0) return;
#ifdef LMSCALE_WITH_CUDA
  if (lane_) {
    LMSCALE_CHECK(src.device() != dst.device(), "HostTransfer::copy: one side on the device, the other on the host");
    LMSCALE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault, lane_->stream));
    return;
  }
#endif
  std::memcpy(dst.data(), src.data(), src.nbytes());
}

void HostTransfer::after(const Fence& f) {
#ifdef LMSCALE_WITH_CUDA
  if (lane_ && f.event) LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(lane_->stream, static_cast<cudaEvent_t>(f.event.get()), 0));
#endif
  (void)f;
}

void HostTransfer::wait(const Fence& f) {
#ifdef LMSCALE_WITH_CUDA
  if (lane_ && f.event) LMSCALE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(f.event.get())));
#endif
  (void)f;
}

void HostTransfer::wait_on(Context& ctx, const Fence& f) {
#ifdef LMSCALE_WITH_CUDA
  if (lane_ && f.event)
    LMSCALE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ctx.stream), static_cast<cudaEvent_t>(f.event.get()), 0));
#endif
  (void)ctx;
  (void)f;
}

}  // namespace lmscale::ops
