#include "comm_thread.h"

#include <chrono>

#include "consistency_check.h"
#include "lmscale/core/error.h"
#include "lmscale/core/trace.h"
#include "mpi_check.h"

namespace lmscale::comm::detail {

namespace {
// While requests are in flight and no job is queued, the thread polls with yields for this many
// rounds (low latency for pipeline send/recv), then sleeps in short waits.
constexpr int kSpinPolls = 2000;
constexpr auto kPollSleep = std::chrono::microseconds(50);
}  // namespace

void MpiWork::wait() {
  if (!done_.load(std::memory_order_acquire)) {
    // run.trace: the time the caller's thread blocks on the communication thread.
    trace::Recorder* rec = trace::active();
    const double begin = rec ? rec->now_us() : 0;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire); });
    }
    if (rec)
      rec->complete(fmt::format("wait {}", name_), trace::kHost, begin, rec->now_us() - begin);
  }
  if (error_) std::rethrow_exception(error_);
}

void MpiWork::complete(std::exception_ptr error) {
  {
    std::lock_guard lk(mu_);
    error_ = std::move(error);
    if (outstanding_ && !done_.load(std::memory_order_relaxed)) outstanding_->fetch_sub(1, std::memory_order_relaxed);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

MpiWork::~MpiWork() {
  if (outstanding_ && !done_.load(std::memory_order_acquire)) outstanding_->fetch_sub(1, std::memory_order_relaxed);
}

CommThread::CommThread(bool threaded, int rank) : threaded_(threaded), rank_(rank) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

CommThread::~CommThread() {
  if (!threaded_) return;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    // While an exception unwinds (core/error.h), the peers may never complete what is queued or
    // posted: drop it rather than wait; the failing rank is about to abort the job.
    if (unwinding()) {
      abandon_ = true;
      queue_.clear();
    }
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<MpiWork> CommThread::submit(Job job, const char* name) {
  auto work = std::make_shared<MpiWork>();
  work->set_name(name);
  work->track(outstanding_);
  Item item{work, std::move(job)};
  if (!threaded_) {
    execute(item);
    return work;
  }
  {
    std::lock_guard lk(mu_);
    if (stop_) throw Error("communicator is shutting down");
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
  return work;
}

void CommThread::fail(const std::shared_ptr<MpiWork>& w, std::exception_ptr e, bool breaks) {
  if (breaks && broken_.empty()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      broken_ = x.what();
    } catch (...) {
      broken_ = "unknown error";
    }
  }
  w->complete(std::move(e));
}

void CommThread::execute(Item& item) {
  if (!broken_.empty()) {
    item.work->complete(std::make_exception_ptr(
        Error(fmt::format("rank {}: communicator unusable after an earlier error: {}", rank_, broken_))));
    return;
  }
  try {
    Posted posted = item.job();
    if (posted.requests.empty()) {
      if (posted.finish) posted.finish({});
      item.work->complete(nullptr);
      return;
    }
    std::vector<MPI_Status> statuses(posted.requests.size());
    if (!threaded_) {
      LMSCALE_MPI_CHECK(MPI_Waitall(static_cast<int>(posted.requests.size()), posted.requests.data(), statuses.data()),
                        rank_);
      if (posted.finish) posted.finish(statuses);
      item.work->complete(nullptr);
      return;
    }
    in_flight_.push_back(InFlight{item.work, std::move(posted), std::move(statuses)});
  } catch (const MismatchError&) {
    fail(item.work, std::current_exception(), false);   // every rank threw alike
  } catch (const UsageError&) {
    fail(item.work, std::current_exception(), false);   // thrown before any message was sent
  } catch (...) {
    fail(item.work, std::current_exception(), true);
  }
}

bool CommThread::poll() {
  bool progress = false;
  for (std::size_t i = 0; i < in_flight_.size();) {
    InFlight& f = in_flight_[i];
    int flag = 0;
    try {
      LMSCALE_MPI_CHECK(MPI_Testall(static_cast<int>(f.posted.requests.size()), f.posted.requests.data(), &flag,
                                    f.statuses.data()),
                        rank_);
      if (!flag) {
        ++i;
        continue;
      }
      if (f.posted.finish) f.posted.finish(f.statuses);
      f.work->complete(nullptr);
    } catch (...) {
      f.work->complete(std::current_exception());   // a point-to-point failure: the peer knows its own
    }
    in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    progress = true;
  }
  return progress;
}

void CommThread::loop() {
  int idle_polls = 0;
  for (;;) {
    Item item;
    bool have = false;
    {
      std::unique_lock lk(mu_);
      if (queue_.empty()) {
        if (in_flight_.empty()) {
          cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        } else if (idle_polls > kSpinPolls) {
          cv_.wait_for(lk, kPollSleep, [&] { return !queue_.empty(); });
        }
      }
      if (!queue_.empty()) {
        item = std::move(queue_.front());
        queue_.pop_front();
        have = true;
      } else if (stop_ && (in_flight_.empty() || abandon_)) {
        return;
      }
    }
    if (have) {
      execute(item);
      idle_polls = 0;
    }
    if (!in_flight_.empty()) {
      if (poll()) {
        idle_polls = 0;
      } else if (++idle_polls <= kSpinPolls) {
        std::this_thread::yield();
      }
    }
  }
}

}  // namespace lmscale::comm::detail
