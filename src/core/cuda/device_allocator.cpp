#include "lmscale/core/cuda/device_allocator.h"

#include "lmscale/core/cuda/cuda_check.h"

namespace lmscale {

CudaCachingAllocator::CudaCachingAllocator(int device) : device_(device) {}

CudaCachingAllocator::~CudaCachingAllocator() { release_cached(); }

std::size_t CudaCachingAllocator::round_size(std::size_t bytes) {
  // 512-byte granularity below 1 MiB, 2 MiB above (limits fragmentation while keeping reuse).
  if (bytes < (1u << 20)) return (bytes + 511) / 512 * 512;
  return (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
}

void* CudaCachingAllocator::allocate(std::size_t bytes, const char* tag) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_size(bytes);
  // Best fit among cached blocks no more than 2x larger than asked.
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= 2 * size) {
    void* p = it->second;
    free_.erase(it);   // sizes_[p] still holds the block's rounded size
    tracker_.on_alloc(bytes, tag);
    return p;
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e != cudaSuccess) {
    cudaGetLastError();
    release_cached();
    e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw OutOfMemory(fmt::format("CUDA out of memory: {} bytes for '{}' ({} bytes in use, {} reserved)", bytes,
                                    tag ? tag : "", tracker_.current(), reserved_),
                        bytes, tracker_.current());
    }
  }
  reserved_ += size;
  sizes_[p] = size;
  tracker_.on_alloc(bytes, tag);
  return p;
}

void CudaCachingAllocator::deallocate(void* ptr, std::size_t bytes, const char* tag) {
  if (!ptr) return;
  auto it = sizes_.find(ptr);
  const std::size_t size = it != sizes_.end() ? it->second : round_size(bytes);
  free_.emplace(size, ptr);
  tracker_.on_free(bytes, tag);
}

void CudaCachingAllocator::release_cached() {
  cudaDeviceSynchronize();
  for (auto& [size, p] : free_) {
    cudaFree(p);
    reserved_ -= size;
    sizes_.erase(p);
  }
  free_.clear();
}

}  // namespace lmscale
