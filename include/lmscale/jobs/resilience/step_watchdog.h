#pragma once
// Rank failure (docs/checkpoints.md): a rank that hangs, or waits forever in a collective for a
// rank that died without the launcher noticing, must not keep the job (and its GPUs) forever.
// A thread watches the job's loop (train, bench-model): the loop marks progress at each phase
// boundary. About once a second (off the critical path: the loop never waits for it) the thread
// reads the communicators' health (Communicator::health: NCCL's ncclCommGetAsyncError, whether
// communication is in flight). When no mark comes for parallel.timeout_s seconds, or a
// communicator reports an asynchronous error, or a peer's watchdog reports a failure, the
// thread exchanges reports with the other ranks' watchdogs (jobs/resilience/rank_failure.h), the lowest
// rank that answered prints ONE line naming the rank that died or hangs, the communicators'
// work in flight is aborted (NCCL: ncclCommAbort) and MPI_Abort ends the whole job (exit 1).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "lmscale/jobs/job_env.h"
#include "lmscale/jobs/resilience/rank_failure.h"

namespace lmscale::jobs {

class StepWatchdog {
 public:
  // timeout_s <= 0: does nothing. Collective when it does something on several ranks (it makes
  // the side channel): every rank constructs it at the same point.
  StepWatchdog(JobEnv& env, std::int64_t timeout_s);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;
  // Progress: the loop is at `step`, entering `phase` ("train step", "evaluation", "checkpoint").
  void mark(std::int64_t step, const char* phase);

  // How long the ranks' watchdogs wait for each other's reports before one of them speaks.
  static constexpr std::chrono::seconds kAnswerWindow{3};

 private:
  void watch();
  [[noreturn]] void fail(RankReport::Reason reason, const std::string& error, bool busy);
  JobEnv& env_;
  std::chrono::seconds timeout_;
  std::unique_ptr<FailureExchange> exchange_;   // null on one rank or without MPI_THREAD_MULTIPLE
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::int64_t step_ = 0;
  std::chrono::steady_clock::time_point marked_at_;
  const char* phase_ = "start";
  std::thread thread_;
};

}  // namespace lmscale::jobs
