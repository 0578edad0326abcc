#pragma once
// Rank failure (docs/checkpoints.md "Rank failure"): when the step watchdog (jobs/resilience/step_watchdog.h)
// of some rank notices a failure (no progress for parallel.timeout_s, or an asynchronous
// communication error such as NCCL's), the ranks that can still run tell each other what they
// see over a side channel of their own (MPI point-to-point on a duplicate of the world, from the
// watchdog threads: the job's communicators may be stuck), and the lowest rank that answered
// prints ONE line naming the rank that failed or hangs, then ends the job.
//
// Who is to blame, from the reports (describe_failure):
//   - ranks that did not answer within the window: died, stopped, or stuck where not even their
//     watchdog thread runs;
//   - else ranks with no communication in flight while others wait in communication: they hang
//     in their own work (the others wait for them);
//   - else ranks that report a communication error; else nobody can be singled out.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lmscale::jobs {

// What one rank sees when a failure is noticed. Plain bytes: sent as MPI_BYTE.
struct RankReport {
  enum Reason : std::int32_t { answered_peer = 0, no_progress = 1, comm_error = 2 };
  std::int32_t rank = 0;
  std::int32_t reason = answered_peer;
  std::int32_t busy = 0;        // communication in flight on this rank (Communicator::health)
  std::int32_t reserved = 0;
  std::int64_t step = 0;        // the watchdog's last progress mark: step and phase
  std::int64_t idle_ms = 0;     // since that mark
  char phase[32] = {};
  char error[224] = {};         // reason comm_error: the communicator's message (truncated)

  void set_phase(const std::string& s);
  void set_error(const std::string& s);
};

// The message (after "error: ") from every rank's report, by rank (nullopt: no answer within
// window_s). `me`: the rank that prints it. timeout_s: parallel.timeout_s. Pure, unit-tested.
std::string describe_failure(const std::vector<std::optional<RankReport>>& reports, int me, std::int64_t timeout_s,
                             double window_s);

// Without the side channel (one rank, or MPI without MPI_THREAD_MULTIPLE): this rank's view only.
std::string describe_own_failure(const RankReport& mine, std::int64_t timeout_s);

// The side channel: MPI point-to-point on its own duplicate of `world` (made in the constructor,
// collective), used from the watchdog thread only (needs MPI_THREAD_MULTIPLE).
class FailureExchange {
 public:
  explicit FailureExchange(MPI_Comm world);
  ~FailureExchange();
  FailureExchange(const FailureExchange&) = delete;
  FailureExchange& operator=(const FailureExchange&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // A peer has sent its report (never blocks).
  bool peer_reported();
  // Sends `mine` to every other rank (non-blocking, never waited for: a dead peer must not block)
  // and collects the reports that arrive within `window` (returns early once all have).
  std::vector<std::optional<RankReport>> exchange(const RankReport& mine, std::chrono::milliseconds window);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<std::optional<RankReport>> received_;
  RankReport sent_;
  std::vector<MPI_Request> sends_;
};

}  // namespace lmscale::jobs
