#include "lmscale/model/model_dims.h"

#include <algorithm>
#include <cmath>

namespace lmscale::model {

ModelDims ModelDims::from(const ModelConfig& m) {
  ModelDims d;
  d.vocab = m.vocab_size;
  d.context = m.context_length;
  d.d_model = m.d_model;
  d.d_ff = m.d_ff;
  d.layers = m.num_layers;
  d.heads = m.num_heads;
  d.rope_theta = m.rope_theta;
  d.norm_eps = m.norm_eps;
  d.flash = m.attention == AttentionImpl::flash;
  d.deterministic_attention = m.attention_deterministic;
  d.ce_chunk_rows = m.ce_chunk_rows;
  d.moe_experts = m.moe_experts;
  d.moe_top_k = m.moe_top_k;
  d.moe_dff = m.moe_expert_dff > 0 ? m.moe_expert_dff : m.d_ff;
  d.moe_every = m.moe_every;
  d.moe_capacity_factor = m.moe_capacity_factor;
  d.moe_aux_loss = m.moe_aux_loss;
  d.moe_z_loss = m.moe_z_loss;
  switch (m.moe_expert_gemm) {
    case MoeExpertGemm::loop: d.moe_expert_gemm = ops::ExpertGemm::loop; break;
    case MoeExpertGemm::grouped: d.moe_expert_gemm = ops::ExpertGemm::grouped; break;
    case MoeExpertGemm::wgmma: d.moe_expert_gemm = ops::ExpertGemm::wgmma; break;
  }
  return d;
}

std::int64_t ModelDims::expert_capacity(std::int64_t T) const {
  const std::int64_t assignments = T * moe_top_k;
  if (moe_capacity_factor <= 0) return assignments;
  const double c = std::ceil(moe_capacity_factor * static_cast<double>(assignments) / static_cast<double>(moe_experts));
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(c));
}

std::int64_t ModelDims::matmul_parameter_count() const {
  const std::int64_t moe_blocks = moe_block_count(), dense_blocks = layers - moe_blocks;
  return layers * 4 * d_model * d_model + dense_blocks * 3 * d_model * d_ff +
         moe_blocks * (moe_experts * d_model + moe_top_k * one_expert_parameters()) + vocab * d_model;
}

std::int64_t ModelDims::parameter_count() const {
  const std::int64_t moe_blocks = moe_block_count(), dense_blocks = layers - moe_blocks;
  return vocab * d_model                                                  // token_embeddings
         + layers * (4 * d_model * d_model + 2 * d_model)                 // attention, ln1, ln2
         + dense_blocks * 3 * d_model * d_ff                              // dense FFNs
         + moe_blocks * moe_experts * d_model + expert_parameter_count()  // routers, experts
         + d_model                                                        // ln_final
         + vocab * d_model;                                               // lm_head
}

std::int64_t ModelDims::active_parameter_count() const {
  return parameter_count() - expert_parameter_count() + moe_block_count() * moe_top_k * one_expert_parameters();
}

double ModelDims::train_flops_per_token(std::int64_t T) const {
  return 6.0 * static_cast<double>(matmul_parameter_count()) +
         12.0 * static_cast<double>(layers) * static_cast<double>(T) * static_cast<double>(d_model);
}

double ModelDims::train_flops_per_token_causal(std::int64_t T) const {
  return 6.0 * static_cast<double>(matmul_parameter_count()) +
         6.0 * static_cast<double>(layers) * static_cast<double>(T) * static_cast<double>(d_model);
}

std::int64_t ModelDims::head_chunk_rows(std::int64_t N, std::int64_t Vl, std::int64_t elem_bytes) const {
  const std::int64_t all = std::max<std::int64_t>(1, N);
  if (ce_chunk_rows == 0) return all;
  if (ce_chunk_rows > 0) return std::min(ce_chunk_rows, all);
  const std::int64_t row_bytes = std::max<std::int64_t>(1, Vl * elem_bytes);
  return std::clamp<std::int64_t>(kAutoChunkLogitBytes / row_bytes, 1, all);
}

}  // namespace lmscale::model
