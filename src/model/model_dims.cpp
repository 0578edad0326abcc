#include "lmscale/model/model_dims.h"

#include <algorithm>

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
  return d;
}

std::int64_t ModelDims::matmul_parameter_count() const {
  return layers * (4 * d_model * d_model + 3 * d_model * d_ff) + vocab * d_model;
}

std::int64_t ModelDims::parameter_count() const {
  return vocab * d_model                                                       // token_embeddings
         + layers * (4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model) // blocks
         + d_model                                                             // ln_final
         + vocab * d_model;                                                    // lm_head
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
