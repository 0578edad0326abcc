#include "lmscale/optim/loss_scaler.h"

#include <algorithm>

namespace lmscale::optim {

bool LossScaler::update(bool found_inf) {
  if (!enabled_) return true;
  if (found_inf) {
    scale_ = std::max(scale_ * 0.5, 1.0);
    clean_ = 0;
    ++skipped_;
    return false;
  }
  if (++clean_ >= window_) {
    scale_ *= 2.0;
    clean_ = 0;
  }
  return true;
}

}  // namespace lmscale::optim
