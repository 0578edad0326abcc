#include "lmscale/model/model_dims.h"

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
  d.flash = m.attention == "flash";
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

}  // namespace lmscale::model
