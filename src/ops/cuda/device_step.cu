// ops::clip_grad_scale on CUDA (ops/device_step.h): one thread adds the partials in index order
// and clips, every operation spelled with the _rn double intrinsics so nvcc contracts nothing and
// the result is bitwise the host's (optim::sum_of_squares + optim::clip_factor). n is the number
// of gradient buckets (tens): the single thread costs a few microseconds.
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "lmscale/ops/device_step.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

__global__ void clip_grad_scale_kernel(const float* __restrict__ partials, std::int64_t n, double inv_scale,
                                       double max_norm, double* __restrict__ out) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) total = __dadd_rn(total, static_cast<double>(partials[i]));
  const double norm = __dmul_rn(__dsqrt_rn(total), inv_scale);
  // optim::clip_factor: 1 when clipping is off or the norm is within the limit (a NaN norm is
  // neither, as on the host; the update is then skipped on the finite flag anyway).
  const double factor = (max_norm <= 0.0 || norm <= max_norm) ? 1.0 : __ddiv_rn(max_norm, __dadd_rn(norm, 1e-6));
  out[kClipNorm] = norm;
  out[kClipGradScale] = __dmul_rn(inv_scale, factor);
  out[kClipFinite] = isfinite(norm) ? 1.0 : 0.0;
}

}  // namespace

void clip_grad_scale(Context& ctx, const Tensor& partials, double inv_scale, double max_norm, Tensor& out) {
  LMSCALE_CHECK(partials.dtype() == DType::f32, "clip_grad_scale: partials must be fp32 on CUDA, are {}",
                dtype_name(partials.dtype()));
  clip_grad_scale_kernel<<<1, 1, 0, stream(ctx)>>>(partials.data_as<const float>(), partials.numel(), inv_scale,
                                                   max_norm, out.data_as<double>());
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
