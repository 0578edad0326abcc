#include "lmscale/model/recompute.h"

#include "lmscale/core/error.h"

namespace lmscale::model {

RecomputePolicy RecomputePolicy::from(const std::string& name, long long k) {
  RecomputePolicy p;
  if (name == "none") return p;
  if (name == "selective" || name == "selective-mlp") {
    p.mode = Mode::selective;
    p.mlp = name == "selective-mlp";
    return p;
  }
  LMSCALE_CHECK(name == "every-k", "activation checkpointing '{}' (none, every-k, selective, selective-mlp)", name);
  LMSCALE_CHECK(k >= 1, "checkpoint_k {} < 1", k);
  p.mode = Mode::every_k;
  p.k = static_cast<int>(k);
  return p;
}

}  // namespace lmscale::model
