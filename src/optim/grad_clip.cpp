#include "lmscale/optim/grad_clip.h"

#include "lmscale/core/error.h"
#include "lmscale/ops/device_step.h"
#include "lmscale/ops/ops.h"

namespace lmscale::optim {

double sum_of_squares(Context& ctx, const Tensor& x) {
  const DType acc = ctx.device == Device::cpu ? DType::f64 : DType::f32;
  Tensor dev = Tensor::empty({1}, acc, *ctx.allocator, "reduction");
  ops::sum_squares(ctx, x, dev);
  Tensor host = Tensor::empty({1}, acc, *ctx.host, "reduction");
  ops::copy(ctx, dev, host);   // device -> pageable host memory returns when the bytes are there
  return acc == DType::f64 ? host.data_as<double>()[0] : static_cast<double>(host.data_as<float>()[0]);
}

Tensor sum_of_squares_parts(Context& ctx, const std::vector<Tensor>& parts) {
  LMSCALE_CHECK(!parts.empty(), "sum_of_squares_parts: no tensors");
  const DType acc = ctx.device == Device::cpu ? DType::f64 : DType::f32;
  const auto n = static_cast<std::int64_t>(parts.size());
  Tensor dev = Tensor::empty({n}, acc, *ctx.allocator, "reduction");
  for (std::int64_t i = 0; i < n; ++i) {
    Tensor slot = dev.flat_range(i, 1);
    ops::sum_squares(ctx, parts[static_cast<std::size_t>(i)], slot);
  }
  return dev;
}

double sum_of_squares(Context& ctx, const std::vector<Tensor>& parts) {
  if (parts.empty()) return 0.0;
  Tensor dev = sum_of_squares_parts(ctx, parts);
  const DType acc = dev.dtype();
  const std::int64_t n = dev.numel();
  Tensor host = Tensor::empty({n}, acc, *ctx.host, "reduction");
  ops::copy(ctx, dev, host);
  double total = 0;
  for (std::int64_t i = 0; i < n; ++i)
    total += acc == DType::f64 ? host.data_as<double>()[i] : static_cast<double>(host.data_as<float>()[i]);
  return total;
}

double clip_factor(double global_norm, double max_norm) { return ops::clip_factor(global_norm, max_norm); }

}  // namespace lmscale::optim
