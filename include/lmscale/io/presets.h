#pragma once
// Model size presets (DESIGN.md §2). They live with the deck because resolving `model.size` is
// part of reading a deck (io may not depend on model/); keys given explicitly win over a preset.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lmscale::io {

struct ModelPreset {
  std::string name;
  std::int64_t d_model, d_ff, num_layers, num_heads, vocab_size;
  double beta2;   // AdamW beta2 the preset recommends
};

const std::vector<ModelPreset>& model_presets();
std::optional<ModelPreset> find_preset(const std::string& name);

}  // namespace lmscale::io
