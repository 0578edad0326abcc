#pragma once
// Model size presets (docs/architecture.md §2). They live with the deck because resolving `model.size` is
// part of reading a deck (io may not depend on model/); keys given explicitly win over a preset.
#include <cstdint>
#include <optional>
#include <string>
#include <set>
#include <vector>

#include "lmscale/io/config.h"

namespace lmscale::io {

struct ModelPreset {
  std::string name;
  std::int64_t d_model, d_ff, num_layers, num_heads, vocab_size;
  double beta2;   // AdamW beta2 the preset recommends
  // Mixture of experts (0 experts: a dense preset): experts, top-k, expert d_ff.
  std::int64_t moe_experts = 0, moe_top_k = 2, moe_expert_dff = 0;
};

const std::vector<ModelPreset>& model_presets();
std::optional<ModelPreset> find_preset(const std::string& name);   // name matched ignoring case

// Fills model.{d_model,d_ff,num_layers,num_heads,vocab_size}, optim.beta2 and, for a mixture-of-
// experts preset, model.{moe_experts,moe_top_k,moe_expert_dff} from the preset
// named by c.model.size, except the keys in `explicit_keys` ("model.d_model", ...), which the
// user set. Does nothing for size "custom". Unknown names throw UsageError naming model.size.
void apply_preset(Config& c, const std::set<std::string>& explicit_keys);

}  // namespace lmscale::io
