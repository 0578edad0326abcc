#pragma once
// std::vector buffers sized by the deck (token batches, host copies of weights): an allocation
// failure becomes OutOfMemory naming what was being allocated and how many bytes, instead of a
// bare std::bad_alloc.
#include <cstddef>
#include <new>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "lmscale/core/error.h"

namespace lmscale {

template <class T>
std::vector<T> host_vector(std::size_t count, const char* what) {
  try {
    return std::vector<T>(count);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  const double bytes = static_cast<double>(count) * sizeof(T);
  throw OutOfMemory(fmt::format("out of host memory: allocating {} ({} elements of {} bytes, {:.0f} bytes = {:.2f} GiB) "
                                "failed",
                                what, count, sizeof(T), bytes, bytes / (1024.0 * 1024 * 1024)),
                    count * sizeof(T), 0);
}

}  // namespace lmscale
