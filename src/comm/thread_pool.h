#pragma once
// A small fork-join pool for the shared-memory collectives: run(tasks, fn) executes fn(0..tasks-1)
// on the pool's workers and the calling thread and returns when all are done. Idle workers spin
// briefly (a collective issues several short parallel phases back to back) and then sleep.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lmscale::comm::detail {

class ThreadPool {
 public:
  // threads: total threads including the caller (>= 1); threads-1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Not reentrant; one caller at a time. Rethrows the first exception of a task.
  void run(int tasks, const std::function<void(int)>& fn);

 private:
  void worker_loop();
  void drain();   // takes tasks of the current round until none are left

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::atomic<std::uint64_t> round_{0};
  bool stop_ = false;
  const std::function<void(int)>* fn_ = nullptr;
  int tasks_ = 0;
  std::atomic<int> next_{0};
  std::atomic<int> remaining_{0};
  int active_ = 0;   // workers inside drain() (guarded by mu_)
  std::exception_ptr error_;
};

}  // namespace lmscale::comm::detail
