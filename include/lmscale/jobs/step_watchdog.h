#pragma once
// Rank failure (docs/checkpoints.md): a rank that hangs, or waits forever in a collective for a
// rank that died without the launcher noticing, must not keep the job (and its GPUs) forever.
// A thread watches the training loop: the loop marks progress at each phase boundary; when no
// mark comes for parallel.timeout_s seconds, the thread prints one message naming this rank, the
// step and the phase, gives the communicators a chance to abort their in-flight work (NCCL:
// ncclCommAbort through Communicator::abort), and ends the whole job with MPI_Abort (exit 1).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

class StepWatchdog {
 public:
  // timeout_s <= 0: does nothing.
  StepWatchdog(JobEnv& env, std::int64_t timeout_s);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;
  // Progress: the loop is at `step`, entering `phase` ("train step", "evaluation", "checkpoint").
  void mark(std::int64_t step, const char* phase);

 private:
  void watch();
  JobEnv& env_;
  std::chrono::seconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::int64_t step_ = 0, marks_ = 0;
  const char* phase_ = "start";
  std::thread thread_;
};

}  // namespace lmscale::jobs
