#pragma once
// NVTX ranges for Nsight Systems: `NvtxRange r("forward");` marks the scope. Without CUDA the NVTX
// calls compile to nothing. When the run records a Chrome trace (run.trace), the same range is
// also recorded as a complete event on the rank's host track and, on CUDA, timed by events on the
// compute stream (core/trace.h); without a trace that costs one thread-local load.
#ifdef LMSCALE_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

#include "lmscale/core/trace.h"

namespace lmscale {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) : trace_(trace::active()), name_(name) {
#ifdef LMSCALE_WITH_CUDA
    nvtxRangePushA(name);
#endif
    if (trace_) {
      begin_us_ = trace_->now_us();
      device_token_ = trace_->device_begin();
    }
  }
  ~NvtxRange() {
#ifdef LMSCALE_WITH_CUDA
    nvtxRangePop();
#endif
    if (trace_) {
      trace_->device_end(device_token_, name_);
      trace_->complete(name_, trace::kHost, begin_us_, trace_->now_us() - begin_us_);
    }
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  trace::Recorder* trace_;
  const char* name_;
  double begin_us_ = 0;
  int device_token_ = -1;
};

}  // namespace lmscale
