#pragma once
// AdamW (DESIGN.md §2) over a contiguous range of the flat parameter buffer: the whole model for
// plain and DDP training, this rank's shard for ZeRO. State m, v has the master dtype and the
// range's size, so its bytes are exactly what the optimizer state costs this rank.
#include <cstdint>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/io/config.h"

namespace lmscale::optim {

class AdamW {
 public:
  // State zeroed on ctx's device.
  AdamW(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx);

  // One step on params/grads (same size as the state); `lowp` (optional, same size) receives the
  // updated parameters in the working dtype. grad_scale multiplies the gradients first (1/loss
  // scale and clipping factor).
  void step(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, double lr, double grad_scale);
  // The same step in pieces (gradients kept per bucket): begin_step() once, then step_range() for
  // elements [offset, offset + params.numel()) of the state, every element exactly once.
  void begin_step() { ++t_; }
  void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                  double grad_scale);

  std::int64_t steps() const { return t_; }
  void set_steps(std::int64_t t) { t_ = t; }
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  std::size_t state_bytes() const { return m_.nbytes() + v_.nbytes(); }

 private:
  OptimConfig cfg_;
  Tensor m_, v_;
  std::int64_t t_ = 0;
};

}  // namespace lmscale::optim
