#pragma once
// Cosine learning-rate schedule with linear warm-up (the CS336 schedule): for step t (0-based),
// t < Tw: lr_max * t / Tw; Tw <= t <= Tc: lr_min + (1 + cos(pi (t - Tw) / (Tc - Tw))) / 2 *
// (lr_max - lr_min); t > Tc: lr_min.
#include <cstdint>

namespace lmscale::optim {

struct CosineSchedule {
  double lr_max, lr_min;
  std::int64_t warmup_steps, cosine_steps;   // Tw, Tc
  double at(std::int64_t t) const;
};

}  // namespace lmscale::optim
