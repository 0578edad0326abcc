#pragma once
// Device memory for all CUDA tensors: a caching, stream-ordered allocator (the scheme PyTorch's
// caching allocator uses).
// - Freed blocks are kept in per-stream free lists and reused, so steady-state training steps make
//   no cudaMalloc/cudaFree calls. Sizes are rounded (512 B below 1 MiB, 2 MiB above) and a cached
//   block is reused for a request of at most 2x (small) or 1.25x (large) less than its size.
// - Stream-ordered reuse: every block belongs to the stream it was allocated for (the allocator's
//   current stream, set_stream). A block freed while kernels queued on that stream may still use
//   it can go at once to the next allocation for the same stream: that work runs after the earlier
//   kernels. A block also used on another stream (record_stream, e.g. a communication stream)
//   returns to the cache only once events recorded on those streams at free time have completed.
// - Out of memory: when cudaMalloc (or the optional reserve limit) refuses, pending blocks are
//   waited for, the whole cache is returned to the driver, and the request retried once; if it
//   still does not fit, lmscale::OutOfMemory is thrown (requested bytes, bytes in use), leaving the
//   allocator usable.
// - Accounting: the MemoryTracker (Allocator::tracker) counts requested bytes (current, peak, per
//   phase, optional timeline of events with tags); stats() adds reserved bytes and call counts.
// - CUDA graphs (train.cuda_graphs; docs/architecture.md §5): a graph pool holds the blocks a
//   captured graph uses, reserved for it while it lives (see begin_capture).
// Thread-safe: one mutex guards the lists and the tracker.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "lmscale/core/allocator.h"

namespace lmscale {

struct CudaAllocatorStats {
  std::uint64_t allocations = 0;       // allocate() calls that returned memory
  std::uint64_t cache_hits = 0;        // ... served from the cache
  std::uint64_t device_mallocs = 0;    // cudaMalloc calls that succeeded
  std::uint64_t device_frees = 0;      // cudaFree calls
  std::uint64_t cache_flushes = 0;     // times the cache was returned to the driver to retry a request
  std::uint64_t out_of_memory = 0;     // OutOfMemory thrown
  std::size_t reserved = 0;            // bytes held from cudaMalloc (in use + cached + pending)
  std::size_t peak_reserved = 0;
  std::size_t cached = 0;              // bytes in free lists, ready for reuse
  std::size_t pending = 0;             // freed bytes waiting for other streams' events
};

class CudaCachingAllocator final : public Allocator {
 public:
  // `device`: the CUDA device the memory lives on (must be current when allocating).
  explicit CudaCachingAllocator(int device, cudaStream_t stream = nullptr);
  ~CudaCachingAllocator() override;
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  void* allocate(std::size_t bytes, const char* tag) override;
  void deallocate(void* ptr, std::size_t bytes, const char* tag) override;
  Device device() const override { return Device::cuda; }
  std::size_t reserved() const override;
  // Waits for the device, then returns every cached block to the driver.
  void release_cached() override;

  // The stream later allocations are for (the runtime's compute stream).
  void set_stream(cudaStream_t stream);
  cudaStream_t stream() const;
  // Marks `ptr` (a live block from this allocator) as used by work on `stream` as well: its
  // reuse after free waits for that work.
  void record_stream(void* ptr, cudaStream_t stream);
  // Caps the bytes reserved from the driver (0 = no cap, the default): requests beyond it behave
  // as if the card were that small (tests; bench sweeps that emulate a smaller GPU).
  void set_reserve_limit(std::size_t bytes);

  CudaAllocatorStats stats() const;

  // ---- graph pools -------------------------------------------------------------------------
  // A new, empty pool (ids from 1).
  int create_pool();
  // Until end_capture(), while the caller captures a graph on stream(): allocations come from
  // the pool's free blocks, else from the shared cache (the block moves into the pool), else from
  // cudaMalloc (in relaxed capture mode, which allows it); every free, whatever allocated the
  // block, goes to the pool, never to the shared cache; a block also used on another stream is not
  // handed out again during the capture (no event can order it inside the graph). Nothing waits
  // for the device, and an allocation that does not fit throws OutOfMemory without flushing the
  // cache. Pre-warm (run the captured work once eagerly) so the shared cache serves the capture.
  void begin_capture(int pool);
  void end_capture();
  // The pool's blocks stay out of the shared cache after the capture: the graph's replays use
  // them. A block of a live pool freed later goes back to the pool. release_pool: the graph is
  // gone and its last replay done (the caller synchronizes); the pool's free blocks return to the
  // shared cache, and its blocks still held become ordinary ones.
  void release_pool(int pool);
  // Bytes of the pool's blocks (held by tensors or free in the pool); 0 for a released pool.
  std::size_t pool_bytes(int pool) const;

 private:
  struct Block {
    std::size_t size = 0;               // rounded size, as allocated from the driver
    cudaStream_t stream = nullptr;      // the stream it was allocated for
    std::vector<cudaStream_t> used_on;  // other streams that used it since it was handed out
    int pool = 0;                       // the graph pool that owns it; 0: the shared cache
  };
  struct Pool {
    std::multimap<std::size_t, void*> free;   // reusable in its capture: size -> block
    std::vector<void*> retired;               // freed in the capture after use on another stream
    std::size_t bytes = 0;
  };
  struct Pending {
    void* ptr;
    std::vector<cudaEvent_t> events;
  };
  static std::size_t round_size(std::size_t bytes);
  static bool fits(std::size_t block, std::size_t want);
  void* take_cached(std::size_t size);        // lock held
  void* take_in_capture(std::size_t size, std::size_t bytes, const char* tag);   // lock held
  void poll_pending(bool wait);               // lock held
  void release_cached_locked();               // lock held
  cudaEvent_t get_event();                    // lock held
  void throw_oom(std::size_t bytes, const char* tag, cudaError_t why);

  mutable std::mutex mu_;
  int device_;
  cudaStream_t stream_;
  std::size_t limit_ = 0;
  CudaAllocatorStats stats_;
  std::unordered_map<void*, Block> blocks_;   // every block held from the driver
  std::unordered_map<cudaStream_t, std::multimap<std::size_t, void*>> free_;   // per stream: size -> block
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> event_pool_;
  std::map<int, Pool> pools_;
  int next_pool_ = 1;
  int capturing_ = 0;   // the pool of the capture under way, 0 when none
};

}  // namespace lmscale
