#include "lmscale/optim/lr_schedule.h"

#include <cmath>

namespace lmscale::optim {

double CosineSchedule::at(std::int64_t t) const {
  if (t < warmup_steps) return lr_max * static_cast<double>(t) / static_cast<double>(warmup_steps);
  if (t > cosine_steps) return lr_min;
  if (cosine_steps == warmup_steps) return lr_max;
  const double p = static_cast<double>(t - warmup_steps) / static_cast<double>(cosine_steps - warmup_steps);
  return lr_min + 0.5 * (1.0 + std::cos(M_PI * p)) * (lr_max - lr_min);
}

}  // namespace lmscale::optim
