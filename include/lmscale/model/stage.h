#pragma once
// The static part of pipeline parallelism (parallel_context.h): which contiguous range of units a
// pipeline stage (or, interleaved, a model chunk) holds. Units: 0 = token embedding, 1..L =
// blocks 0..L-1, L+1 = final RMSNorm + LM head + loss. Because the flat parameter layout follows
// the units in order, a unit range is also a contiguous range of parameters and of the flat
// buffer, so a stage's ParameterStore is the full store's slice [first_param, end_param).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/model/model_dims.h"

namespace lmscale::model {

struct StageUnits {
  int first = 0;    // first unit held
  int end = -1;     // one past the last unit held; -1: up to and including the head (L + 2)

  static StageUnits all() { return {}; }
  int end_unit(const ModelDims& d) const { return end < 0 ? static_cast<int>(d.layers) + 2 : end; }
  bool owns_embedding() const { return first == 0; }
  bool owns_head(const ModelDims& d) const { return end_unit(d) == static_cast<int>(d.layers) + 2; }
  bool is_all(const ModelDims& d) const { return owns_embedding() && owns_head(d); }
  // Blocks [first_layer, end_layer) held (may be empty).
  int first_layer() const { return first == 0 ? 0 : first - 1; }
  int end_layer(const ModelDims& d) const { return std::min(end_unit(d), static_cast<int>(d.layers) + 1) - 1; }
  // Parameters of the flat layout held: [first_param, end_param) (model/param_layout.h).
  int first_param(const ModelDims& d) const;
  int end_param(const ModelDims& d) const;
};

// Blocks per stage for `stages` stages (pipeline degree x virtual stages): as even as possible,
// the remainder going to the later stages' (the first stage also holds the embedding, the last
// the head, which for small vocabularies are cheaper than a block). `override_layers`, when not
// empty, gives the blocks of each stage explicitly (parallel.stage_layers).
std::vector<int> stage_layer_counts(const ModelDims& d, int stages, const std::vector<std::int64_t>& override_layers = {});
// The units of stage s of `counts` (stage 0 adds the embedding, the last stage the head).
StageUnits stage_units(const ModelDims& d, const std::vector<int>& counts, int s);
// The model chunks of pipeline rank `stage` of `stages` with `virtual_stages` chunks each (the
// interleaved schedule; 1 otherwise): chunk c is virtual stage c * stages + stage of the
// stages * virtual_stages equal splits (or of override_layers when given, one chunk per rank).
std::vector<StageUnits> pipeline_chunks(const ModelDims& d, int stages, int virtual_stages, int stage,
                                        const std::vector<std::int64_t>& override_layers = {});

}  // namespace lmscale::model
