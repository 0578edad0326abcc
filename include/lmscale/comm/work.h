#pragma once
// Work: the handle every collective returns (shared ownership; copies refer to the same work).
//
//  wait()          mpi:  blocks until the operation is done on this rank, rethrows its error.
//                  nccl: makes the compute stream wait for the operation (cudaStreamWaitEvent);
//                        the host does not block. Work queued on the compute stream afterwards
//                        sees the result.
//  synchronize()   blocks the host until the operation is done (both backends); rethrows.
//  is_completed()  true once the operation has finished on this rank (never blocks).
//
// A default-constructed Work is complete. Buffers passed to a collective must stay alive and
// unmodified until the work is waited on.
#include <memory>

namespace lmscale::comm {

class WorkState {
 public:
  virtual ~WorkState() = default;
  virtual void wait() = 0;
  virtual void synchronize() = 0;
  virtual bool is_completed() = 0;
};

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  void wait() {
    if (state_) state_->wait();
  }
  void synchronize() {
    if (state_) state_->synchronize();
  }
  bool is_completed() const { return !state_ || state_->is_completed(); }
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace lmscale::comm
