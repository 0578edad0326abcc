#include "lmscale/jobs/step_watchdog.h"

#include <cstdio>

#include <fmt/format.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mpi_environment.h"

namespace lmscale::jobs {

StepWatchdog::StepWatchdog(JobEnv& env, std::int64_t timeout_s) : env_(env), timeout_(timeout_s) {
  if (timeout_s > 0) thread_ = std::thread([this] { watch(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StepWatchdog::mark(std::int64_t step, const char* phase) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lk(mu_);
    step_ = step;
    phase_ = phase;
    ++marks_;
  }
  cv_.notify_all();
}

void StepWatchdog::watch() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    const std::int64_t seen = marks_;
    if (cv_.wait_for(lk, timeout_, [&] { return stop_ || marks_ != seen; })) continue;
    // No progress for timeout_: this rank is stuck (in a collective whose peer died or hangs, or in
    // its own work). One line, then the whole job ends: a stuck job holds its nodes forever.
    fmt::print(stderr,
               "lmscale: rank {}: error: no progress for {} s (parallel.timeout_s) in the {} of step {}: a rank "
               "has died or hangs; aborting the job\n",
               env_.rank, timeout_.count(), phase_, step_);
    std::fflush(stderr);
    // NCCL kernels waiting for a dead peer never finish: abort them so the process can exit.
    for (auto* c : {env_.comm.get(), env_.host_comm.get()})
      if (c) c->abort();
    env_.mpi.abort(1);
  }
}

}  // namespace lmscale::jobs
