#pragma once
// The communication thread of an MpiCommunicator: jobs run one after another in submission order;
// a job either finishes its operation or posts non-blocking MPI requests (send/recv), which the
// thread completes by polling while it runs later jobs. Without MPI_THREAD_MULTIPLE the same
// interface runs each job inline on the caller's thread and waits for its requests at once.
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lmscale/comm/work.h"

namespace lmscale::comm::detail {

// Work of the mpi backend: done when the thread says so; wait() blocks and rethrows.
class MpiWork final : public WorkState {
 public:
  void wait() override;
  void synchronize() override { wait(); }
  bool is_completed() override { return done_.load(std::memory_order_acquire); }
  void complete(std::exception_ptr error);
  // The op's name for run.trace's "wait" events (a string literal).
  void set_name(const char* name) { name_ = name; }
  // Counts this work in `outstanding` until it completes (Communicator::health's busy).
  void track(std::shared_ptr<std::atomic<std::int64_t>> outstanding) {
    outstanding_ = std::move(outstanding);
    outstanding_->fetch_add(1, std::memory_order_relaxed);
  }
  ~MpiWork() override;

 private:
  const char* name_ = "comm";
  std::shared_ptr<std::atomic<std::int64_t>> outstanding_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

// What a job leaves behind: nothing (done), or requests to complete later. `finish` runs after
// all requests completed, with their statuses (e.g. to check a received size); it may throw.
struct Posted {
  std::vector<MPI_Request> requests;
  std::function<void(const std::vector<MPI_Status>&)> finish;
};

class CommThread {
 public:
  using Job = std::function<Posted()>;
  // rank: for error messages.
  CommThread(bool threaded, int rank);
  // Runs what was queued, completes posted requests, then joins.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  bool threaded() const { return threaded_; }
  // Works submitted and not completed yet (shared: a parent communicator watches its children's).
  const std::shared_ptr<std::atomic<std::int64_t>>& outstanding() const { return outstanding_; }
  std::shared_ptr<MpiWork> submit(Job job, const char* name = "comm");

 private:
  struct Item {
    std::shared_ptr<MpiWork> work;
    Job job;
  };
  struct InFlight {
    std::shared_ptr<MpiWork> work;
    Posted posted;
    std::vector<MPI_Status> statuses;
  };
  void loop();
  void execute(Item& item);              // runs a job, records in-flight requests
  bool poll();                           // completes finished in-flight requests; true if any
  void fail(const std::shared_ptr<MpiWork>& w, std::exception_ptr e, bool breaks);

  const bool threaded_;
  const int rank_;
  std::shared_ptr<std::atomic<std::int64_t>> outstanding_ = std::make_shared<std::atomic<std::int64_t>>(0);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  bool abandon_ = false;   // destroyed while an exception unwinds: leave in-flight work behind
  std::vector<InFlight> in_flight_;   // thread-owned
  std::string broken_;                // thread-owned: set after an error that may leave ranks out of step
  std::thread thread_;
};

}  // namespace lmscale::comm::detail
