#include <cstdlib>
#include <new>

#include "lmscale/core/allocator.h"
#include "lmscale/core/error.h"

namespace lmscale {

void* HostAllocator::allocate(std::size_t bytes, const char* tag) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) {
    throw OutOfMemory(fmt::format("host allocation of {} bytes for '{}' failed", bytes, tag ? tag : ""), bytes,
                      tracker_.current());
  }
  tracker_.on_alloc(bytes, tag);
  return p;
}

void HostAllocator::deallocate(void* ptr, std::size_t bytes, const char* tag) {
  if (!ptr) return;
  std::free(ptr);
  tracker_.on_free(bytes, tag);
}

}  // namespace lmscale
