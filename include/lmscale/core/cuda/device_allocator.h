#pragma once
// Device memory for all CUDA tensors: a caching allocator. Freed blocks are kept in size-class
// free lists and reused, so steady-state steps make no cudaMalloc/cudaFree calls; cudaMalloc
// failures release the cache and retry once, then throw OutOfMemory.
#include <cstddef>
#include <map>
#include <vector>

#include "lmscale/core/allocator.h"

namespace lmscale {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device);
  ~CudaCachingAllocator() override;
  void* allocate(std::size_t bytes, const char* tag) override;
  void deallocate(void* ptr, std::size_t bytes, const char* tag) override;
  Device device() const override { return Device::cuda; }
  std::size_t reserved() const override { return reserved_; }
  void release_cached() override;

 private:
  static std::size_t round_size(std::size_t bytes);
  int device_;
  std::size_t reserved_ = 0;
  std::multimap<std::size_t, void*> free_;   // rounded size -> cached block
  std::map<void*, std::size_t> sizes_;       // block -> its rounded size
};

}  // namespace lmscale
