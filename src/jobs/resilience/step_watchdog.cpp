#include "lmscale/jobs/resilience/step_watchdog.h"

#include <cstdio>
#include <future>
#include <memory>

#include <fmt/format.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mpi_environment.h"

namespace lmscale::jobs {

namespace {
// How often the thread looks at the clock, the communicators' health and the side channel.
constexpr std::chrono::milliseconds kPoll{500};
// A rank that is not the one to speak ends the job itself after this long (the speaker may die).
constexpr std::chrono::seconds kSpeakerGrace{10};
}  // namespace

StepWatchdog::StepWatchdog(JobEnv& env, std::int64_t timeout_s) : env_(env), timeout_(timeout_s) {
  if (timeout_s <= 0) return;
  if (env.world > 1 && env.mpi.thread_multiple()) exchange_ = std::make_unique<FailureExchange>(env.mpi.world());
  marked_at_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { watch(); });
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
  std::lock_guard lk(mu_);
  step_ = step;
  phase_ = phase;
  marked_at_ = std::chrono::steady_clock::now();
}

void StepWatchdog::watch() {
  std::unique_lock lk(mu_);
  while (!cv_.wait_for(lk, kPoll, [&] { return stop_; })) {
    const bool stalled = std::chrono::steady_clock::now() - marked_at_ >= timeout_;
    lk.unlock();
    comm::CommHealth health;
    for (const auto& c : {env_.comm, env_.host_comm}) {
      if (!c) continue;
      comm::CommHealth h = c->health();
      if (health.error.empty()) health.error = h.error;
      health.busy = health.busy || h.busy;
    }
    if (stalled) fail(RankReport::no_progress, "", health.busy);
    if (!health.error.empty()) fail(RankReport::comm_error, health.error, health.busy);
    if (exchange_ && exchange_->peer_reported()) fail(RankReport::answered_peer, "", health.busy);
    lk.lock();
  }
}

void StepWatchdog::fail(RankReport::Reason reason, const std::string& error, bool busy) {
  RankReport mine;
  mine.rank = env_.rank;
  mine.reason = reason;
  mine.busy = busy ? 1 : 0;
  mine.set_error(error);
  {
    std::lock_guard lk(mu_);
    mine.step = step_;
    mine.set_phase(phase_);
    mine.idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - marked_at_)
                       .count();
  }
  std::string line;
  if (exchange_) {
    // Every rank whose watchdog can run reports (within the window); the lowest that did speaks.
    const auto reports = exchange_->exchange(mine, kAnswerWindow);
    int speaker = env_.rank;
    for (std::size_t q = 0; q < reports.size(); ++q)
      if (reports[q]) {
        speaker = static_cast<int>(q);
        break;
      }
    // The speaker prints and ends the job; should it not within the grace, this rank does.
    if (speaker != env_.rank) std::this_thread::sleep_for(kSpeakerGrace);
    line = describe_failure(reports, env_.rank, timeout_.count(), static_cast<double>(kAnswerWindow.count()));
  } else {
    line = describe_own_failure(mine, timeout_.count());
  }
  fmt::print(stderr, "lmscale: rank {}: error: {}\n", env_.rank, line);
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

}  // namespace lmscale::jobs
