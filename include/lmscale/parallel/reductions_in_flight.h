#pragma once
// The asynchronous gradient reductions a data-parallel strategy launched during one step's
// backward, waited together after it (docs/architecture.md §4): DDP's all-reduces and ZeRO-2's
// reduce-scatters, each a bucket's backend (parallel/bucket_reducer.h). With
// parallel.grad_reduce_dtype = bf16 a collective runs on a bf16 copy of its range: the copy's
// result is widened back into the fp32 gradients after the wait, and the send buffer stays
// allocated until then.
#include <vector>

#include "lmscale/comm/work.h"
#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::parallel {

class ReductionsInFlight {
 public:
  // A new step (the last step's reductions were waited).
  void clear();
  // `keep`: a buffer the collective reads (empty: none to keep), freed after the wait.
  void add(comm::Work w, Tensor keep = {});
  // A collective on a reduced-precision copy: its result `stage` [n] is widened into `dst` [n]
  // (the fp32 gradients) after the wait.
  void add_staged(comm::Work w, Tensor stage, Tensor dst, Tensor keep = {});
  // Waits for every collective in launch order, then widens the staged results in launch order
  // on ctx's stream (ctx may be null when nothing is staged) and frees the copies
  // (stream-ordered, after the casts).
  void wait(Context* ctx);

 private:
  struct Staged {
    Tensor stage, dst;
  };
  std::vector<comm::Work> works_;
  std::vector<Staged> staged_;
  std::vector<Tensor> keep_;
};

}  // namespace lmscale::parallel
