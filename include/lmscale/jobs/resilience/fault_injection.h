#pragma once
// TEST-ONLY fault injection for the rank-failure tests (scripts/gpu/rank_failure.sh,
// docs/checkpoints.md "Rank failure"): makes one rank hang inside a training step, so that the
// watchdog (jobs/resilience/step_watchdog.h) can be shown to end the job naming it. Read once from the
// environment when a Trainer is made and kept in it (no global state); unset = nothing happens.
//   LMSCALE_FAULT_SLEEP_RANK  world rank that sleeps
//   LMSCALE_FAULT_SLEEP_STEP  at the start of this step (the trainer's step count; default 3)
//   LMSCALE_FAULT_SLEEP_S     for this long (default 600)
// And, for the kill -9 test of the results file (docs/reliability.md), the time bound of its flush:
//   LMSCALE_TEST_FLUSH_S      seconds between flushes of the step table at the latest (default 10)
// A bad value is a usage error (exit 2) naming the variable.
#include <cstdint>

namespace lmscale::jobs {

struct FaultInjection {
  int sleep_rank = -1;
  std::int64_t sleep_step = 3;
  double sleep_s = 600;
  double flush_s = 10;   // the train job flushes its step table at least this often

  static FaultInjection from_environment();
  // Sleeps when this is the rank and the step (prints one line to stderr first).
  void at_step_start(int rank, std::int64_t step) const;
};

}  // namespace lmscale::jobs
