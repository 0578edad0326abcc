// ops::rope: shape, dtype and device checks, then dispatch.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

void rope(Context& ctx, Tensor& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, double theta,
          bool inverse, std::int64_t row_stride) {
  constexpr const char* op = "ops::rope";
  const Device dev = detail::common_device(op, {{"x", &x}});
  LMSCALE_CHECK(B >= 0 && T >= 0 && H >= 0 && Dh >= 0, "{}: negative dimension in B={} T={} H={} Dh={}", op, B, T,
                H, Dh);
  LMSCALE_CHECK(Dh % 2 == 0, "{}: head_dim Dh={} must be even (RoPE rotates pairs)", op, Dh);
  LMSCALE_CHECK(theta > 0, "{}: theta must be > 0, got {}", op, theta);
  if (row_stride == 0) row_stride = H * Dh;
  LMSCALE_CHECK(row_stride >= H * Dh, "{}: row_stride {} is below H*Dh = {}", op, row_stride, H * Dh);
  if (row_stride == H * Dh) {
    detail::check_numel(op, "x", x, B * T * H * Dh);
  } else {   // heads inside wider rows: x must reach the last row's last head
    const std::int64_t extent = B * T == 0 ? 0 : (B * T - 1) * row_stride + H * Dh;
    LMSCALE_CHECK(x.numel() >= extent, "{}: 'x' has {} elements; {} rows of {} with row stride {} need {}", op,
                  x.numel(), B * T, H * Dh, row_stride, extent);
  }
  detail::check_floating(op, "x", x);
  if (dev == Device::cpu) return cpu::rope(ctx, x, B, T, H, Dh, theta, inverse, row_stride);
#ifdef LMSCALE_WITH_CUDA
  return cuda::rope(ctx, x, B, T, H, Dh, theta, inverse, row_stride);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
