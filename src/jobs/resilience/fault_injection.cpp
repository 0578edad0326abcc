#include "lmscale/jobs/resilience/fault_injection.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "lmscale/core/error.h"

namespace lmscale::jobs {

namespace {

template <class T>
void read_env(const char* name, T& value) {
  const char* s = std::getenv(name);
  if (!s || !*s) return;
  try {
    std::size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != std::string(s).size() || v < 0) throw std::invalid_argument(s);
    value = static_cast<T>(v);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("{}='{}': expected a number >= 0 (test-only fault injection; unset it)", name, s));
  }
}

}  // namespace

FaultInjection FaultInjection::from_environment() {
  FaultInjection f;
  read_env("LMSCALE_TEST_FLUSH_S", f.flush_s);
  if (!std::getenv("LMSCALE_FAULT_SLEEP_RANK")) return f;
  read_env("LMSCALE_FAULT_SLEEP_RANK", f.sleep_rank);
  read_env("LMSCALE_FAULT_SLEEP_STEP", f.sleep_step);
  read_env("LMSCALE_FAULT_SLEEP_S", f.sleep_s);
  return f;
}

void FaultInjection::at_step_start(int rank, std::int64_t step) const {
  if (rank != sleep_rank || step != sleep_step) return;
  fmt::print(stderr, "lmscale: rank {}: test-only fault injection (LMSCALE_FAULT_SLEEP_RANK): sleeping {} s at the "
                     "start of step {}\n", rank, sleep_s, step);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
}

}  // namespace lmscale::jobs
