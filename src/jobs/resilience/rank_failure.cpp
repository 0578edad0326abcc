#include "lmscale/jobs/resilience/rank_failure.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lmscale/core/error.h"

namespace lmscale::jobs {

namespace {

constexpr int kReportTag = 7301;

template <std::size_t N>
void copy_text(char (&dst)[N], const std::string& s) {
  const std::size_t n = std::min(N - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

std::string text(const char* s, std::size_t n) { return std::string(s, strnlen(s, n)); }

// "rank 1" / "ranks 0, 2"
std::string ranks_text(const std::vector<int>& r) {
  return fmt::format("{} {}", r.size() == 1 ? "rank" : "ranks", fmt::join(r, ", "));
}

std::string where(const RankReport& r) {
  return fmt::format("the {} of step {}", text(r.phase, sizeof r.phase), r.step);
}

}  // namespace

void RankReport::set_phase(const std::string& s) { copy_text(phase, s); }
void RankReport::set_error(const std::string& s) { copy_text(error, s); }

std::string describe_failure(const std::vector<std::optional<RankReport>>& reports, int me, std::int64_t timeout_s,
                             double window_s) {
  std::vector<int> silent, idle, busy, errors;
  const RankReport* trigger = nullptr;   // what started it: this rank's own reason first
  for (std::size_t q = 0; q < reports.size(); ++q) {
    const auto& r = reports[q];
    const int rank = static_cast<int>(q);
    if (!r) {
      silent.push_back(rank);
      continue;
    }
    (r->busy ? busy : idle).push_back(rank);
    if (r->reason == RankReport::comm_error) errors.push_back(rank);
    if (r->reason != RankReport::answered_peer && (!trigger || rank == me)) trigger = &*r;
  }
  std::string what;
  if (trigger) {
    const std::string who = trigger->rank == me ? "" : fmt::format("rank {}: ", trigger->rank);
    what = trigger->reason == RankReport::no_progress
               ? fmt::format("{}no progress for {} s (parallel.timeout_s) in {}", who, timeout_s, where(*trigger))
               : fmt::format("{}{}", who, text(trigger->error, sizeof trigger->error));
  } else {
    what = "a peer reported a failure";
  }
  std::string blame;
  if (!silent.empty()) {
    blame = fmt::format("{} did not answer within {:.0f} s: died, stopped, or stuck where its watchdog cannot run",
                        ranks_text(silent), window_s);
  } else if (!idle.empty() && !busy.empty()) {
    const RankReport& first = *reports[static_cast<std::size_t>(idle.front())];
    blame = fmt::format("{} {} outside communication (rank {} in {}) while {} {} for it in communication",
                        ranks_text(idle), idle.size() == 1 ? "hangs" : "hang", first.rank, where(first),
                        ranks_text(busy), busy.size() == 1 ? "waits" : "wait");
  } else if (!errors.empty()) {
    blame = fmt::format("{} {} a communication error", ranks_text(errors), errors.size() == 1 ? "reports" : "report");
  } else if (idle.empty()) {
    blame = "no rank can be singled out: every rank waits in communication (mismatched collectives, or a peer "
            "outside the job)";
  } else {
    blame = "no rank can be singled out: no rank is in communication (every rank is stuck in its own work)";
  }
  return fmt::format("{}; {}; aborting the job", what, blame);
}

std::string describe_own_failure(const RankReport& mine, std::int64_t timeout_s) {
  const std::string what = mine.reason == RankReport::comm_error
                               ? text(mine.error, sizeof mine.error)
                               : fmt::format("no progress for {} s (parallel.timeout_s) in {}", timeout_s, where(mine));
  return fmt::format("{}: a rank has died or hangs ({}); aborting the job", what,
                     mine.busy ? "this rank waits in communication" : "this rank is not in communication");
}

FailureExchange::FailureExchange(MPI_Comm world) {
  MPI_Comm_dup(world, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  received_.resize(static_cast<std::size_t>(size_));
}

FailureExchange::~FailureExchange() {
  // Only reached on the healthy path (a failure ends the process): no report was sent.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL && !unwinding()) MPI_Comm_free(&comm_);
}

bool FailureExchange::peer_reported() {
  int flag = 0;
  MPI_Status st;
  return MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, comm_, &flag, &st) == MPI_SUCCESS && flag;
}

std::vector<std::optional<RankReport>> FailureExchange::exchange(const RankReport& mine,
                                                                 std::chrono::milliseconds window) {
  received_[static_cast<std::size_t>(rank_)] = mine;
  sent_ = mine;   // the send buffer lives as long as this object
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(&sent_, sizeof(RankReport), MPI_BYTE, q, kReportTag, comm_, &req) == MPI_SUCCESS)
      sends_.push_back(req);   // never waited for: the job is about to end
  }
  const auto deadline = std::chrono::steady_clock::now() + window;
  auto missing = [&] {
    return std::count_if(received_.begin(), received_.end(), [](const auto& r) { return !r.has_value(); });
  };
  while (missing() > 0 && std::chrono::steady_clock::now() < deadline) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, comm_, &flag, &st) != MPI_SUCCESS || !flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    RankReport r;
    if (MPI_Recv(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, kReportTag, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) continue;
    r.rank = st.MPI_SOURCE;
    received_[static_cast<std::size_t>(st.MPI_SOURCE)] = r;
  }
  return received_;
}

}  // namespace lmscale::jobs
