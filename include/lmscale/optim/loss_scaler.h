#pragma once
// Dynamic loss scaling for fp16 mixed precision: the loss is multiplied by `scale` before the
// backward; a step whose gradients hold inf/nan is skipped and the scale halved; after `window`
// clean steps in a row the scale doubles.
#include <cstdint>

namespace lmscale::optim {

class LossScaler {
 public:
  LossScaler(double init_scale, std::int64_t window, bool enabled)
      : scale_(enabled ? init_scale : 1.0), window_(window), enabled_(enabled) {}
  double scale() const { return scale_; }
  void set_scale(double s) { scale_ = s; }   // when resuming from a checkpoint
  bool enabled() const { return enabled_; }
  // Call once per step with whether any gradient overflowed; returns true if the optimizer step
  // should be applied.
  bool update(bool found_inf);
  std::int64_t skipped() const { return skipped_; }
  // Clean steps since the last change of scale: part of the state a bitwise resume restores.
  std::int64_t clean_steps() const { return clean_; }
  void set_clean_steps(std::int64_t n) { clean_ = n; }

 private:
  double scale_;
  std::int64_t window_;
  bool enabled_;
  std::int64_t clean_ = 0, skipped_ = 0;
};

}  // namespace lmscale::optim
