#include "lmscale/jobs/step_watchdog.h"

#include <cstdio>
#include <future>
#include <memory>

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
    // NCCL kernels waiting for a dead peer never finish: abort them so the process can exit. On a
    // thread of its own, waited for at most 5 s: an abort that blocks must not keep MPI_Abort,
    // which ends every rank whatever state NCCL is in, from running.
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> aborted = done->get_future();
    std::thread([comm = env_.comm, host = env_.host_comm, done] {
      for (auto* c : {comm.get(), host.get()})
        if (c) c->abort();
      done->set_value();
    }).detach();
    aborted.wait_for(std::chrono::seconds(5));
    env_.mpi.abort(1);
  }
}

}  // namespace lmscale::jobs
