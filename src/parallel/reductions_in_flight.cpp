#include "lmscale/parallel/reductions_in_flight.h"

#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"

namespace lmscale::parallel {

void ReductionsInFlight::clear() {
  works_.clear();
  staged_.clear();
  keep_.clear();
}

void ReductionsInFlight::add(comm::Work w, Tensor keep) {
  works_.push_back(std::move(w));
  if (keep.defined()) keep_.push_back(std::move(keep));
}

void ReductionsInFlight::add_staged(comm::Work w, Tensor stage, Tensor dst, Tensor keep) {
  add(std::move(w), std::move(keep));
  staged_.push_back({std::move(stage), std::move(dst)});
}

void ReductionsInFlight::wait(Context* ctx) {
  LMSCALE_CHECK(ctx != nullptr || staged_.empty(), "staged gradient reductions need a context to widen them on");
  for (auto& w : works_) w.wait();
  works_.clear();
  for (auto& s : staged_) ops::cast(*ctx, s.stage, s.dst);
  staged_.clear();
  keep_.clear();
}

}  // namespace lmscale::parallel
