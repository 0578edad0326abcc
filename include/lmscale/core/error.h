#pragma once
// Error types. Exit codes (app/main.cpp): UsageError -> 2, everything else -> 1.
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace lmscale {

// A runtime failure (exit code 1).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad usage or a bad deck (exit code 2): the message names the key and the fix.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A UsageError that every rank throws together, after the ranks agreed on it (app/main.cpp's
// deck checks, jobs/resilience/rank_agreement.h): rank 0 prints it once and every rank exits 2.
// Any other UsageError in a job of several ranks may be one rank's alone (a file only that rank
// reads, found mid-job) while the others wait in a collective: main then ends the whole job with
// exit 2 through MPI_Abort (docs/reliability.md).
class AgreedUsageError : public UsageError {
 public:
  using UsageError::UsageError;
};

// An allocation that did not fit. Jobs that sweep sizes catch it and record "OOM".
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, std::size_t requested_bytes, std::size_t in_use_bytes)
      : Error(what), requested(requested_bytes), in_use(in_use_bytes) {}
  std::size_t requested;
  std::size_t in_use;
};

// True while an exception unwinds the stack (in a destructor that the unwinding runs). No
// collective runs then (docs/reliability.md): the peers may never join it, and the failing rank
// ends the job (MPI_Abort) as soon as the exception reaches main. Destructors of objects that
// communicate or wait for communication skip their collectives, frees and waits while it is true
// and leave what they hold to the operating system.
inline bool unwinding() noexcept { return std::uncaught_exceptions() > 0; }

}  // namespace lmscale

// Throws lmscale::Error with the location when `cond` is false; the message is fmt-formatted.
#define LMSCALE_CHECK(cond, ...)                                                                  \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      throw ::lmscale::Error(fmt::format("{}:{}: check failed: {}: {}", __FILE__, __LINE__, #cond, \
                                         fmt::format(__VA_ARGS__)));                              \
    }                                                                                             \
  } while (0)
