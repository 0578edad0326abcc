#pragma once
// The shape of the Transformer LM (docs/architecture.md §2), resolved from the deck's [model] section.
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
  bool deterministic_attention = false;   // flash backward without atomics (model.attention_deterministic)
  std::int64_t ce_chunk_rows = -1;   // fused LM head + cross-entropy: -1 auto, 0 all rows, n rows
  std::int64_t head_dim() const { return d_model / heads; }

  static ModelDims from(const ModelConfig& m);
  // Rows per chunk of the fused LM head + cross-entropy for N rows of Vl logits of elem_bytes
  // each (model.ce_chunk_rows): auto = the most rows whose logits fit in 256 MiB (>= 1), so small
  // models run one chunk (bitwise the unchunked results); all = N; n = min(n, N). At least 1.
  std::int64_t head_chunk_rows(std::int64_t N, std::int64_t Vl, std::int64_t elem_bytes) const;
  static constexpr std::int64_t kAutoChunkLogitBytes = 256LL << 20;
  // Parameter counts: all, and those of the matmuls outside the embedding (for FLOP counts).
  std::int64_t parameter_count() const;
  std::int64_t matmul_parameter_count() const;   // per-layer q,k,v,o,w1,w2,w3 + lm_head
  // Training FLOPs per token at sequence length T (forward + backward = 3x forward):
  // 6 * matmul parameters + 12 * L * T * d (attention scores and weighted sum, counted over the
  // full T x T score matrix as in the PaLM/Megatron convention, i.e. not halved for causal).
  double train_flops_per_token(std::int64_t T) const;
  double forward_flops_per_token(std::int64_t T) const { return train_flops_per_token(T) / 3.0; }
  // The same with causal attention counted as half the score matrix: 6 * matmul parameters +
  // 6 * L * T * d (the convention of FlashAttention's and the CS336 leaderboard's MFU; stored
  // beside the full-matrix convention, never instead of it).
  double train_flops_per_token_causal(std::int64_t T) const;
};

}  // namespace lmscale::model
