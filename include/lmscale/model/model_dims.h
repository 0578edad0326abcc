#pragma once
// The shape of the Transformer LM (docs/architecture.md §2), resolved from the deck's [model] section.
#include <cstdint>
#include <string>

#include "lmscale/io/config.h"
#include "lmscale/ops/moe_experts.h"

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
  // Mixture of experts (docs/moe.md): E experts of inner size Fe in every moe_every-th block
  // (blocks l with l % moe_every == moe_every - 1), top-k routing; E = 0: dense.
  std::int64_t moe_experts = 0;        // E
  std::int64_t moe_top_k = 2;          // k
  std::int64_t moe_dff = 0;            // Fe (resolved: model.moe_expert_dff, or d_ff when 0)
  std::int64_t moe_every = 1;
  double moe_capacity_factor = 0.0;    // 0 = dropless
  double moe_aux_loss = 0.0;           // load-balancing loss coefficient
  double moe_z_loss = 0.0;             // router z-loss coefficient
  ops::ExpertGemm moe_expert_gemm = ops::ExpertGemm::loop;   // model.moe_expert_gemm (CUDA only)
  std::int64_t head_dim() const { return d_model / heads; }
  constexpr bool moe() const { return moe_experts > 0; }
  constexpr bool is_moe_block(std::int64_t l) const { return moe() && l % moe_every == moe_every - 1; }
  constexpr std::int64_t moe_block_count() const { return moe() ? layers / moe_every : 0; }
  // The most assignments one expert takes from one sequence of T tokens (the capacity's group,
  // docs/moe.md): ceil(cf * T * k / E), at least 1; dropless (cf = 0): all T * k.
  std::int64_t expert_capacity(std::int64_t T) const;

  static ModelDims from(const ModelConfig& m);
  // Rows per chunk of the fused LM head + cross-entropy for N rows of Vl logits of elem_bytes
  // each (model.ce_chunk_rows): auto = the most rows whose logits fit in 256 MiB (>= 1), so small
  // models run one chunk (bitwise the unchunked results); all = N; n = min(n, N). At least 1.
  std::int64_t head_chunk_rows(std::int64_t N, std::int64_t Vl, std::int64_t elem_bytes) const;
  static constexpr std::int64_t kAutoChunkLogitBytes = 256LL << 20;
  // Parameter counts: all, and those of the matmuls outside the embedding (for FLOP counts).
  // In an MoE model every expert counts in parameter_count(); matmul_parameter_count() counts
  // what one token uses (the router and k experts of each MoE block), so the FLOPs below are the
  // active FLOPs. active_parameter_count(): the parameters one token uses, embedding included.
  std::int64_t parameter_count() const;
  std::int64_t matmul_parameter_count() const;   // per-layer q,k,v,o,w1,w2,w3 (active) + lm_head
  std::int64_t active_parameter_count() const;
  // Parameters of all experts of all MoE blocks (w1, w2, w3), and of one expert of one block.
  std::int64_t expert_parameter_count() const { return moe_block_count() * moe_experts * one_expert_parameters(); }
  std::int64_t one_expert_parameters() const { return 3 * d_model * moe_dff; }
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
