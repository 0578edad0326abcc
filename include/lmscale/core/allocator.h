#pragma once
// Allocators hand out raw bytes for tensors and count them in a MemoryTracker. The host one is
// plain aligned malloc; the CUDA one (core/cuda/caching_allocator.h) caches freed blocks.
#include <cstddef>

#include "lmscale/core/device.h"
#include "lmscale/core/memory_tracker.h"

namespace lmscale {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws OutOfMemory when the bytes cannot be had. `tag` must outlive the allocation
  // (string literals).
  virtual void* allocate(std::size_t bytes, const char* tag) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, const char* tag) = 0;
  virtual Device device() const = 0;
  // Bytes reserved from the system (>= tracker().current() for a caching allocator).
  virtual std::size_t reserved() const { return tracker_.current(); }
  // Returns cached blocks to the system (no-op for the host allocator).
  virtual void release_cached() {}
  MemoryTracker& tracker() { return tracker_; }
  const MemoryTracker& tracker() const { return tracker_; }

 protected:
  MemoryTracker tracker_;
};

// 64-byte aligned host memory, counted.
class HostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, const char* tag) override;
  void deallocate(void* ptr, std::size_t bytes, const char* tag) override;
  Device device() const override { return Device::cpu; }
};

}  // namespace lmscale
