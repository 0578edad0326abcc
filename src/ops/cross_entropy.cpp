// ops::cross_entropy: shape, dtype and device checks, then dispatch.
// logits [..., V] (N rows), targets int32 with N elements, loss_sum 1 element (fp32; fp64 for
// fp64 logits), dlogits (optional) the shape and dtype of logits, possibly the same memory.
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, Tensor& loss_sum, Tensor* dlogits,
                   double grad_scale) {
  constexpr const char* op = "ops::cross_entropy";
  const Device dev = detail::common_device(
      op, {{"logits", &logits}, {"targets", &targets}, {"loss_sum", &loss_sum}, {"dlogits", dlogits}});
  detail::check_floating(op, "logits", logits);
  const std::int64_t rows = detail::rows_of(op, "logits", logits);
  LMSCALE_CHECK(logits.dim(-1) > 0 || logits.numel() == 0, "{}: logits {} has an empty vocabulary dimension", op,
                shape_str(logits.shape()));
  detail::check_dtype(op, "targets", targets, DType::i32);
  detail::check_numel(op, "targets", targets, rows);
  detail::check_numel(op, "loss_sum", loss_sum, 1);
  detail::check_dtype(op, "loss_sum", loss_sum, detail::stats_dtype(logits.dtype()));
  if (dlogits) {
    detail::check_shape(op, "dlogits", *dlogits, logits.shape());
    detail::check_same_dtype(op, "logits", logits, "dlogits", *dlogits);
  }
  if (dev == Device::cpu) return cpu::cross_entropy(ctx, logits, targets, loss_sum, dlogits, grad_scale);
#ifdef LMSCALE_WITH_CUDA
  return cuda::cross_entropy(ctx, logits, targets, loss_sum, dlogits, grad_scale);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
