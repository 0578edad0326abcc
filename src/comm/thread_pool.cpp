#include "thread_pool.h"

#include <chrono>

namespace lmscale::comm::detail {

namespace {
constexpr auto kSpin = std::chrono::microseconds(50);
}

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    round_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain() {
  for (;;) {
    const int i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= tasks_) return;
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lk(mu_);
      done_.notify_all();
    }
  }
}

void ThreadPool::run(int tasks, const std::function<void(int)>& fn) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    for (int i = 0; i < tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lk(mu_);
    fn_ = &fn;
    tasks_ = tasks;
    error_ = nullptr;
    next_.store(0, std::memory_order_relaxed);
    remaining_.store(tasks, std::memory_order_relaxed);
    round_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain();
  {
    std::unique_lock lk(mu_);
    // Also wait for workers to leave drain(), so none of them reads the next round's fields early.
    done_.wait(lk, [&] { return remaining_.load(std::memory_order_acquire) == 0 && active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }
}

void ThreadPool::worker_loop() {
  std::uint64_t seen = 0;
  for (;;) {
    // Spin a little for the next round (phases of one collective follow each other closely).
    const auto t0 = std::chrono::steady_clock::now();
    while (round_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() - t0 < kSpin) {
      std::this_thread::yield();
    }
    {
      std::unique_lock lk(mu_);
      wake_.wait(lk, [&] { return stop_ || round_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      seen = round_.load(std::memory_order_acquire);
      if (fn_ == nullptr) continue;   // the round already finished
      ++active_;
    }
    drain();
    {
      std::lock_guard lk(mu_);
      --active_;
    }
    done_.notify_all();
  }
}

}  // namespace lmscale::comm::detail
