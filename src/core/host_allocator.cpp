#include <cstdint>
#include <cstdlib>
#include <new>

#include "lmscale/core/allocator.h"
#include "lmscale/core/error.h"

namespace lmscale {

void* HostAllocator::allocate(std::size_t bytes, const char* tag) {
  if (bytes == 0) return nullptr;
  // A size near SIZE_MAX (an overflowed product upstream) must fail, not wrap to a small block.
  const std::size_t rounded = bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) / 64 * 64;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
  if (!p) {
    throw OutOfMemory(fmt::format("out of host memory: allocating {} bytes ({:.2f} GiB) for '{}' failed ({:.2f} GiB "
                                  "held by tensors already)",
                                  bytes, static_cast<double>(bytes) / (1 << 30), tag ? tag : "",
                                  static_cast<double>(tracker_.current()) / (1 << 30)),
                      bytes, tracker_.current());
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
