#pragma once
// How parallel strategies reach into the model without the model knowing about communication
// (DESIGN.md §1). With every degree 1 it is a no-op: the default-constructed context.
#include <functional>

namespace lmscale::model {

struct ParallelContext {
  // Called during the backward as soon as parameter i's gradient is final for this backward
  // pass (in reverse layer order), so data-parallel strategies can start reducing it while the
  // backward goes on.
  std::function<void(int param_index)> on_grad_ready;
};

}  // namespace lmscale::model
