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
};

const std::vector<ModelPreset>& model_presets();
std::optional<ModelPreset> find_preset(const std::string& name);   // name matched ignoring case

// Fills model.{d_model,d_ff,num_layers,num_heads,vocab_size} and optim.beta2 from the preset
// named by c.model.size, except the keys in `explicit_keys` ("model.d_model", ...), which the
// user set. Does nothing for size "custom". Unknown names throw UsageError naming model.size.
void apply_preset(Config& c, const std::set<std::string>& explicit_keys);

}  // namespace lmscale::io
