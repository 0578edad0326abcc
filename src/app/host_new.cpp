// The executable's global operator new: std::malloc, as the library's, but a failure throws a
// std::bad_alloc whose message says how many bytes were asked for, so that an allocation that
// fails despite the memory check before the run (jobs/predict/memory_fit.h) ends with
// "out of host memory: a request for 6400000000064 bytes (5.82 TiB) failed" instead of a bare
// "std::bad_alloc". Sized and aligned variants of new keep the library's definitions (they call
// this one or use aligned allocation); delete stays std::free-compatible.
#include <cstdio>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define LMSCALE_KEEP_LIBRARY_NEW 1   // the sanitizer's own operator new tracks allocations
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LMSCALE_KEEP_LIBRARY_NEW 1
#endif
#endif

#ifndef LMSCALE_KEEP_LIBRARY_NEW

namespace {

class SizedBadAlloc final : public std::bad_alloc {
 public:
  explicit SizedBadAlloc(std::size_t bytes) {
    // No allocation here: the message is formatted into the object itself.
    const double b = static_cast<double>(bytes);
    const char* unit = "GiB";
    double v = b / (1024.0 * 1024 * 1024);
    if (v >= 1024) {
      v /= 1024;
      unit = "TiB";
    } else if (v < 1) {
      v = b / (1024.0 * 1024);
      unit = "MiB";
    }
    std::snprintf(message_, sizeof message_, "a request for %zu bytes (%.2f %s) failed (std::bad_alloc)", bytes, v,
                  unit);
  }
  const char* what() const noexcept override { return message_; }

 private:
  char message_[128];
};

}  // namespace

void* operator new(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  while (true) {
    if (void* p = std::malloc(bytes)) return p;
    std::new_handler handler = std::get_new_handler();
    if (!handler) throw SizedBadAlloc(bytes);
    handler();
  }
}

void* operator new[](std::size_t bytes) { return ::operator new(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

#endif
