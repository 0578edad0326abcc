// ops::clip_grad_scale on the CPU (ops/device_step.h): the host arithmetic of the eager step
// (optim::sum_of_squares, then optim::clip_factor), written once more over a tensor so the CUDA
// kernel has a reference to be held to bitwise.
#include <cmath>

#include "cpu_ops.h"
#include "lmscale/core/error.h"
#include "lmscale/ops/device_step.h"

namespace lmscale::ops::cpu {

void clip_grad_scale(Context&, const Tensor& partials, double inv_scale, double max_norm, Tensor& out) {
  double total = 0.0;
  const std::int64_t n = partials.numel();
  if (partials.dtype() == DType::f64) {
    for (std::int64_t i = 0; i < n; ++i) total += partials.data_as<const double>()[i];
  } else {
    LMSCALE_CHECK(partials.dtype() == DType::f32, "clip_grad_scale: partials must be fp32 or fp64, are {}",
                  dtype_name(partials.dtype()));
    for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(partials.data_as<const float>()[i]);
  }
  const double norm = std::sqrt(total) * inv_scale;
  const double factor = clip_factor(norm, max_norm);
  double* o = out.data_as<double>();
  o[kClipNorm] = norm;
  o[kClipGradScale] = inv_scale * factor;
  o[kClipFinite] = std::isfinite(norm) ? 1.0 : 0.0;
}

}  // namespace lmscale::ops::cpu
