#pragma once
// The shape of the Transformer LM (DESIGN.md §2), resolved from the deck's [model] section.
#include <cstdint>
#include <string>

#include "lmscale/io/config.h"

namespace lmscale::model {

struct ModelDims {
  std::int64_t vocab = 10000;     // V
  std::int64_t context = 256;     // T (maximum sequence length)
  std::int64_t d_model = 512;     // d
  std::int64_t d_ff = 1344;       // F
  std::int64_t layers = 4;        // L
  std::int64_t heads = 16;        // H
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool flash = false;             // attention implementation: flash (true) or naive
  std::int64_t head_dim() const { return d_model / heads; }

  static ModelDims from(const ModelConfig& m);
  // Parameter counts: all, and those of the matmuls outside the embedding (for FLOP counts).
  std::int64_t parameter_count() const;
  std::int64_t matmul_parameter_count() const;   // per-layer q,k,v,o,w1,w2,w3 + lm_head
  // Training FLOPs per token at sequence length T (forward + backward = 3x forward):
  // 6 * matmul parameters + 12 * L * T * d (attention scores and weighted sum, counted over the
  // full T x T score matrix as in the PaLM/Megatron convention, i.e. not halved for causal).
  double train_flops_per_token(std::int64_t T) const;
  double forward_flops_per_token(std::int64_t T) const { return train_flops_per_token(T) / 3.0; }
};

}  // namespace lmscale::model
