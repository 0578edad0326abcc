#include "lmscale/model/recompute.h"

#include "lmscale/core/error.h"

namespace lmscale::model {

RecomputePolicy RecomputePolicy::from(Checkpointing kind, long long k, bool keep_attention, long long layers) {
  RecomputePolicy p;
  LMSCALE_CHECK(!keep_attention || kind == Checkpointing::every_k,
                "keep_attention with activation checkpointing '{}' (every-k only)", kind);
  LMSCALE_CHECK(layers >= 0 && (layers == 0 || kind == Checkpointing::every_k),
                "checkpointed layers {} with activation checkpointing '{}' (every-k only, >= 0)", layers, kind);
  switch (kind) {
    case Checkpointing::none: return p;
    case Checkpointing::selective:
    case Checkpointing::selective_mlp:
      p.mode = Mode::selective;
      p.mlp = kind == Checkpointing::selective_mlp;
      return p;
    case Checkpointing::every_k: break;
  }
  LMSCALE_CHECK(k >= 1, "checkpoint_k {} < 1", k);
  p.mode = Mode::every_k;
  p.k = static_cast<int>(k);
  p.keep_attention = keep_attention;
  p.layers = static_cast<int>(layers);
  return p;
}

BlockKeep RecomputePolicy::block(int l, int l0, int l1, bool flash) const {
  BlockKeep b;
  switch (mode) {
    case Mode::none: break;
    case Mode::every_k:
      b.recomputed = l < checkpointed_end(l0, l1);
      b.group_input = b.recomputed && (l % k == 0 || l == l0);
      b.attention = b.recomputed && keep_attention;
      break;
    case Mode::selective:
      b.drop_norms = true;
      b.drop_probabilities = !flash;
      b.drop_ffn_inputs = mlp;
      break;
  }
  return b;
}

RecomputePolicy RecomputePolicy::from(const TrainConfig& t) {
  return from(t.activation_checkpointing, t.checkpoint_k, t.checkpoint_keep_attention, t.checkpoint_layers);
}

}  // namespace lmscale::model
