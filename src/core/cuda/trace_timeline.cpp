// The CUDA side of run.trace (core/trace.h DeviceTimeline): timing events from a pool, an origin
// event recorded when the timeline starts (aligned with the recorder's host clock at that moment),
// and ranges resolved with cudaEventElapsedTime once their end event has completed.
#include <cuda_runtime.h>

#include <deque>
#include <mutex>
#include <vector>

#include "lmscale/core/cuda/cuda_check.h"
#include "lmscale/core/trace.h"

namespace lmscale::trace {

namespace {

// Ranges pending before a non-blocking resolve is tried: often enough to bound memory, rarely
// enough that the queries cost nothing measurable.
constexpr std::size_t kResolveEvery = 512;

class CudaTimeline final : public DeviceTimeline {
 public:
  CudaTimeline(Recorder& rec, void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    origin_ = make_event();
    LMSCALE_CUDA_CHECK(cudaEventRecord(origin_, stream_));
    origin_us_ = rec.now_us();
  }
  ~CudaTimeline() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaEventDestroy(origin_);
  }

  int begin(void* stream) override {
    std::lock_guard lk(mu_);
    const int token = take();
    LMSCALE_CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(token)], pick(stream)));
    return token;
  }

  void end(void* stream, int token, std::string name, int tid, std::string args) override {
    Recorder* rec = nullptr;
    {
      std::lock_guard lk(mu_);
      const int stop = take();
      LMSCALE_CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(stop)], pick(stream)));
      pending_.push_back(Pending{std::move(name), tid, token, stop, std::move(args)});
      if (pending_.size() % kResolveEvery == 0) rec = active();
    }
    if (rec) flush(*rec, false);
  }

  void flush(Recorder& rec, bool wait) override {
    std::lock_guard lk(mu_);
    while (!pending_.empty()) {
      Pending& p = pending_.front();
      cudaEvent_t stop = events_[static_cast<std::size_t>(p.stop)];
      if (wait) {
        LMSCALE_CUDA_CHECK(cudaEventSynchronize(stop));
      } else {
        const cudaError_t q = cudaEventQuery(stop);
        if (q == cudaErrorNotReady) break;   // later ranges end later on the stream
        LMSCALE_CUDA_CHECK(q);
      }
      float begin_ms = 0, end_ms = 0;
      LMSCALE_CUDA_CHECK(cudaEventElapsedTime(&begin_ms, origin_, events_[static_cast<std::size_t>(p.start)]));
      LMSCALE_CUDA_CHECK(cudaEventElapsedTime(&end_ms, origin_, stop));
      rec.complete(std::move(p.name), p.tid, origin_us_ + 1e3 * begin_ms, 1e3 * (end_ms - begin_ms), std::move(p.args));
      free_.push_back(p.start);
      free_.push_back(p.stop);
      pending_.pop_front();
    }
  }

 private:
  struct Pending {
    std::string name;
    int tid, start, stop;
    std::string args;
  };
  static cudaEvent_t make_event() {
    cudaEvent_t e = nullptr;
    LMSCALE_CUDA_CHECK(cudaEventCreate(&e));   // with timing: that is the point
    return e;
  }
  // A start event is reused only once its range is resolved (both events returned together).
  int take() {
    if (!free_.empty()) {
      const int t = free_.back();
      free_.pop_back();
      return t;
    }
    events_.push_back(make_event());
    return static_cast<int>(events_.size() - 1);
  }
  cudaStream_t pick(void* stream) const { return stream ? static_cast<cudaStream_t>(stream) : stream_; }

  cudaStream_t stream_;
  cudaEvent_t origin_ = nullptr;
  double origin_us_ = 0;
  std::mutex mu_;
  std::vector<cudaEvent_t> events_;
  std::vector<int> free_;
  std::deque<Pending> pending_;
};

}  // namespace

std::unique_ptr<DeviceTimeline> make_cuda_timeline(Recorder& rec, void* compute_stream) {
  return std::make_unique<CudaTimeline>(rec, compute_stream);
}

}  // namespace lmscale::trace
