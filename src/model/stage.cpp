#include "lmscale/model/stage.h"

#include <algorithm>
#include <sstream>

#include "lmscale/core/error.h"
#include "lmscale/model/param_layout.h"

namespace lmscale::model {

int StageUnits::first_param(const ModelDims& d) const { return ParamIndex(d).first_of_unit(first); }

int StageUnits::end_param(const ModelDims& d) const { return ParamIndex(d).first_of_unit(end_unit(d)); }

std::vector<int> stage_layer_counts(const ModelDims& d, int stages, const std::vector<std::int64_t>& override_layers) {
  const int L = static_cast<int>(d.layers);
  LMSCALE_CHECK(stages >= 1 && stages <= L, "{} pipeline stages for {} layers", stages, L);
  if (!override_layers.empty()) {
    LMSCALE_CHECK(static_cast<int>(override_layers.size()) == stages, "stage_layers has {} entries for {} stages",
                  override_layers.size(), stages);
    std::int64_t sum = 0;
    for (std::int64_t n : override_layers) {
      LMSCALE_CHECK(n >= 1, "stage_layers: every stage needs at least one layer");
      sum += n;
    }
    LMSCALE_CHECK(sum == L, "stage_layers sum to {} but the model has {} layers", sum, L);
    return std::vector<int>(override_layers.begin(), override_layers.end());
  }
  std::vector<int> c(static_cast<std::size_t>(stages), L / stages);
  for (int r = 0; r < L % stages; ++r) c[static_cast<std::size_t>(stages - 1 - r)] += 1;
  return c;
}

StageUnits stage_units(const ModelDims& d, const std::vector<int>& counts, int s) {
  int first_layer = 0;
  for (int i = 0; i < s; ++i) first_layer += counts[static_cast<std::size_t>(i)];
  const int end_layer = first_layer + counts[static_cast<std::size_t>(s)];
  StageUnits u;
  u.first = s == 0 ? 0 : first_layer + 1;
  u.end = s + 1 == static_cast<int>(counts.size()) ? static_cast<int>(d.layers) + 2 : end_layer + 1;
  return u;
}

std::vector<StageUnits> pipeline_chunks(const ModelDims& d, int stages, int virtual_stages, int stage,
                                        const std::vector<std::int64_t>& override_layers) {
  const auto counts = stage_layer_counts(d, stages * virtual_stages, override_layers);
  std::vector<StageUnits> chunks;
  for (int c = 0; c < virtual_stages; ++c) chunks.push_back(stage_units(d, counts, c * stages + stage));
  return chunks;
}


}  // namespace lmscale::model
