#include "lmscale/core/cuda/device_allocator.h"

#include <algorithm>

#include "lmscale/core/cuda/cuda_check.h"

namespace lmscale {

namespace {
constexpr std::size_t kSmall = std::size_t{1} << 20;       // 1 MiB
constexpr std::size_t kLargeRound = std::size_t{2} << 20;  // 2 MiB
}  // namespace

CudaCachingAllocator::CudaCachingAllocator(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

namespace {
// cudaMalloc is refused in a thread capturing in global or thread-local mode; relaxed allows it
// (it enqueues nothing). Restores the thread's mode when the scope ends, exception or not.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};
}  // namespace

CudaCachingAllocator::~CudaCachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  cudaDeviceSynchronize();
  poll_pending(true);
  for (auto& [id, pool] : pools_) {
    for (auto& [size, p] : pool.free) {
      free_[blocks_.at(p).stream].emplace(size, p);
      stats_.cached += size;
    }
    for (void* p : pool.retired) {
      free_[blocks_.at(p).stream].emplace(blocks_.at(p).size, p);
      stats_.cached += blocks_.at(p).size;
    }
  }
  pools_.clear();
  release_cached_locked();
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  // Blocks still handed out belong to tensors that outlive the allocator: left to process exit.
}

std::size_t CudaCachingAllocator::round_size(std::size_t bytes) {
  if (bytes < kSmall) return (bytes + 511) / 512 * 512;
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

bool CudaCachingAllocator::fits(std::size_t block, std::size_t want) {
  // Limits the bytes a request may waste, so a big cached block is not tied up by a small tensor.
  return want < kSmall ? block <= 2 * want : block <= want + want / 4;
}

void CudaCachingAllocator::set_stream(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mu_);
  stream_ = s;
}

cudaStream_t CudaCachingAllocator::stream() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stream_;
}

void CudaCachingAllocator::set_reserve_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}

std::size_t CudaCachingAllocator::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.reserved;
}

CudaAllocatorStats CudaCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void* CudaCachingAllocator::take_cached(std::size_t size) {
  auto list = free_.find(stream_);
  if (list == free_.end()) return nullptr;
  auto it = list->second.lower_bound(size);   // best fit: the smallest block that is large enough
  if (it == list->second.end() || !fits(it->first, size)) return nullptr;
  void* p = it->second;
  stats_.cached -= it->first;
  list->second.erase(it);
  return p;
}

cudaEvent_t CudaCachingAllocator::get_event() {
  if (!event_pool_.empty()) {
    cudaEvent_t e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  cudaEvent_t e;
  LMSCALE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CudaCachingAllocator::poll_pending(bool wait) {
  auto done = [&](Pending& p) {
    for (cudaEvent_t e : p.events) {
      const cudaError_t r = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
      if (r == cudaErrorNotReady) return false;
      if (r != cudaSuccess) LMSCALE_CUDA_CHECK(r);
    }
    return true;
  };
  auto it = pending_.begin();
  while (it != pending_.end()) {
    if (!done(*it)) {
      ++it;
      continue;
    }
    Block& b = blocks_.at(it->ptr);
    free_[b.stream].emplace(b.size, it->ptr);
    stats_.pending -= b.size;
    stats_.cached += b.size;
    for (cudaEvent_t e : it->events) event_pool_.push_back(e);
    it = pending_.erase(it);
  }
}

void CudaCachingAllocator::release_cached_locked() {
  for (auto& [s, list] : free_) {
    for (auto& [size, p] : list) {
      cudaFree(p);
      ++stats_.device_frees;
      stats_.reserved -= size;
      stats_.cached -= size;
      blocks_.erase(p);
    }
    list.clear();
  }
}

void CudaCachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  LMSCALE_CHECK(!capturing_, "release_cached during a graph capture (it waits for the device)");
  LMSCALE_CUDA_CHECK(cudaDeviceSynchronize());
  poll_pending(true);
  release_cached_locked();
}

void CudaCachingAllocator::throw_oom(std::size_t bytes, const char* tag, cudaError_t why) {
  ++stats_.out_of_memory;
  std::size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  cudaGetLastError();   // clear the sticky-free error state of the failed cudaMalloc
  throw OutOfMemory(
      fmt::format("CUDA out of memory: {:.2f} MiB for '{}' ({:.2f} MiB in use, {:.2f} MiB reserved{}; device {:.2f} "
                  "of {:.2f} MiB free): {}",
                  bytes / 1048576.0, tag ? tag : "", tracker_.current() / 1048576.0, stats_.reserved / 1048576.0,
                  limit_ ? fmt::format(", limit {:.2f} MiB", limit_ / 1048576.0) : std::string(),
                  free_b / 1048576.0, total_b / 1048576.0,
                  why == cudaSuccess ? "reserve limit" : cudaGetErrorString(why)),
      bytes, tracker_.current());
}

void* CudaCachingAllocator::take_in_capture(std::size_t size, std::size_t bytes, const char* tag) {
  Pool& pool = pools_.at(capturing_);
  auto it = pool.free.lower_bound(size);
  if (it != pool.free.end() && fits(it->first, size)) {
    void* p = it->second;
    pool.free.erase(it);
    ++stats_.cache_hits;
    return p;
  }
  void* p = take_cached(size);
  if (p) {
    ++stats_.cache_hits;
  } else {
    RelaxedCaptureMode relaxed;
    cudaError_t err = cudaSuccess;
    if (!limit_ || stats_.reserved + size <= limit_) {
      err = cudaMalloc(&p, size);
      if (err != cudaSuccess) {
        cudaGetLastError();
        p = nullptr;
      }
    }
    if (!p) throw_oom(bytes, tag, err);   // no flush: it would wait for the device
    ++stats_.device_mallocs;
    stats_.reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    blocks_[p] = Block{size, stream_, {}, 0};
  }
  Block& b = blocks_.at(p);
  b.pool = capturing_;
  pool.bytes += b.size;
  return p;
}

void* CudaCachingAllocator::allocate(std::size_t bytes, const char* tag) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t size = round_size(bytes);
  if (capturing_) {
    void* p = take_in_capture(size, bytes, tag);
    Block& b = blocks_.at(p);
    b.stream = stream_;
    b.used_on.clear();
    ++stats_.allocations;
    tracker_.on_alloc(bytes, tag);
    return p;
  }
  if (!pending_.empty()) poll_pending(false);
  void* p = take_cached(size);
  if (p) {
    ++stats_.cache_hits;
  } else {
    // Two tries: as things are, then after waiting for pending blocks and flushing the cache.
    cudaError_t err = cudaSuccess;
    for (int attempt = 0; attempt < 2 && !p; ++attempt) {
      if (attempt == 1) {
        ++stats_.cache_flushes;
        cudaDeviceSynchronize();
        poll_pending(true);
        release_cached_locked();
      }
      if (limit_ && stats_.reserved + size > limit_) continue;
      err = cudaMalloc(&p, size);
      if (err != cudaSuccess) {
        cudaGetLastError();
        p = nullptr;
      }
    }
    if (!p) throw_oom(bytes, tag, err);
    ++stats_.device_mallocs;
    stats_.reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    blocks_[p] = Block{size, stream_, {}, 0};
  }
  Block& b = blocks_.at(p);
  b.stream = stream_;
  b.used_on.clear();
  ++stats_.allocations;
  tracker_.on_alloc(bytes, tag);
  return p;
}

void CudaCachingAllocator::record_stream(void* ptr, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  LMSCALE_CHECK(it != blocks_.end(), "record_stream: {} was not allocated here", ptr);
  Block& b = it->second;
  if (s != b.stream && std::find(b.used_on.begin(), b.used_on.end(), s) == b.used_on.end()) b.used_on.push_back(s);
}

void CudaCachingAllocator::deallocate(void* ptr, std::size_t bytes, const char* tag) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  LMSCALE_CHECK(it != blocks_.end(), "CudaCachingAllocator: free of {} ('{}'), which it did not allocate", ptr,
                tag ? tag : "");
  Block& b = it->second;
  tracker_.on_free(bytes, tag);
  // A graph pool's block stays with its pool; in a capture every other block joins the pool being
  // captured (the graph may have used it: it must not go to work outside the graph).
  const int pool_id = b.pool ? b.pool : capturing_;
  if (pool_id) {
    Pool& pool = pools_.at(pool_id);
    if (b.pool == 0) {
      b.pool = pool_id;
      pool.bytes += b.size;
    }
    if (capturing_ == pool_id && !b.used_on.empty()) {
      pool.retired.push_back(ptr);
    } else {
      pool.free.emplace(b.size, ptr);
    }
    b.used_on.clear();
    return;
  }
  if (b.used_on.empty()) {
    free_[b.stream].emplace(b.size, ptr);
    stats_.cached += b.size;
    return;
  }
  // Reusable once the work queued so far on the other streams is done.
  Pending pend{ptr, {}};
  for (cudaStream_t s : b.used_on) {
    cudaEvent_t e = get_event();
    LMSCALE_CUDA_CHECK(cudaEventRecord(e, s));
    pend.events.push_back(e);
  }
  b.used_on.clear();
  stats_.pending += b.size;
  pending_.push_back(std::move(pend));
}

int CudaCachingAllocator::create_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_pool_++;
  pools_[id] = Pool{};
  return id;
}

void CudaCachingAllocator::begin_capture(int pool) {
  std::lock_guard<std::mutex> lock(mu_);
  LMSCALE_CHECK(!capturing_, "begin_capture({}): pool {} is being captured", pool, capturing_);
  LMSCALE_CHECK(pools_.count(pool), "begin_capture: no pool {}", pool);
  capturing_ = pool;
}

void CudaCachingAllocator::end_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  LMSCALE_CHECK(capturing_, "end_capture without begin_capture");
  Pool& pool = pools_.at(capturing_);
  for (void* p : pool.retired) pool.free.emplace(blocks_.at(p).size, p);
  pool.retired.clear();
  capturing_ = 0;
}

void CudaCachingAllocator::release_pool(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  LMSCALE_CHECK(capturing_ != id, "release_pool({}) during its capture", id);
  auto it = pools_.find(id);
  if (it == pools_.end()) return;
  for (auto& [size, p] : it->second.free) {
    Block& b = blocks_.at(p);
    free_[b.stream].emplace(size, p);
    stats_.cached += size;
  }
  for (auto& [p, b] : blocks_)
    if (b.pool == id) b.pool = 0;
  pools_.erase(it);
}

std::size_t CudaCachingAllocator::pool_bytes(int pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? 0 : it->second.bytes;
}

}  // namespace lmscale
