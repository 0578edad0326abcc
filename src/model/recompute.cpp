#include "lmscale/model/recompute.h"

#include "lmscale/core/error.h"

namespace lmscale::model {

RecomputePolicy RecomputePolicy::from(const std::string& name, long long k, bool keep_attention) {
  RecomputePolicy p;
  LMSCALE_CHECK(!keep_attention || name == "every-k", "keep_attention with activation checkpointing '{}' (every-k only)",
                name);
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
  p.keep_attention = keep_attention;
  return p;
}

}  // namespace lmscale::model
