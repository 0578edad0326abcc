#pragma once
// Preemption (docs/checkpoints.md): SIGTERM or SIGUSR1 asks the run to stop. The handler only
// sets a flag; at each step boundary the ranks agree (one all-reduce of the flags, so a signal
// that reached one rank stops all of them at the same step), write a checkpoint, finish the
// results file marked `interrupted`, and exit with kExitInterrupted.
#include <csignal>

#include "lmscale/parallel/gradient_sync.h"

namespace lmscale::jobs {

// EX_TEMPFAIL of sysexits.h: "try again later" -- the job was stopped, not failed; resubmitted
// with train.resume = auto it continues where it stopped.
inline constexpr int kExitInterrupted = 75;

class PreemptionWatch {
 public:
  // Installs the handlers for SIGTERM and SIGUSR1. They stay installed until the process exits: a
  // signal that comes after the last step (while the results are finished) must not kill a rank
  // half-way through its exit, which would leave its peers in a collective with a dead rank.
  PreemptionWatch();
  PreemptionWatch(const PreemptionWatch&) = delete;
  PreemptionWatch& operator=(const PreemptionWatch&) = delete;
  // Collective over the data-parallel ranks (through `sync`): true on every rank when any rank
  // has received a signal.
  bool agreed_stop(parallel::GradientSync& sync) const;
  // The signal number this rank received (0 = none; another rank's may have stopped it).
  int signal() const;
};

}  // namespace lmscale::jobs
