#include "lmscale/model/recompute.h"

#include "lmscale/core/error.h"

namespace lmscale::model {

RecomputePolicy RecomputePolicy::from(const std::string& name, long long k, bool keep_attention, long long layers) {
  RecomputePolicy p;
  LMSCALE_CHECK(!keep_attention || name == "every-k", "keep_attention with activation checkpointing '{}' (every-k only)",
                name);
  LMSCALE_CHECK(layers >= 0 && (layers == 0 || name == "every-k"),
                "checkpointed layers {} with activation checkpointing '{}' (every-k only, >= 0)", layers, name);
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
  p.layers = static_cast<int>(layers);
  return p;
}

RecomputePolicy RecomputePolicy::from(const TrainConfig& t) {
  return from(t.activation_checkpointing, t.checkpoint_k, t.checkpoint_keep_attention, t.checkpoint_layers);
}

}  // namespace lmscale::model
