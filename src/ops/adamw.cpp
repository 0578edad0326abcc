// ops::adamw: shape, dtype, device and hyper-parameter checks, then dispatch.
#include <cmath>

#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

namespace {
void check_step(const char* op, const AdamWStep& a) {
  LMSCALE_CHECK(a.step >= 1, "{}: step t is 1-based, got {}", op, a.step);
  LMSCALE_CHECK(a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1,
                "{}: betas must lie in [0, 1), got beta1={} beta2={}", op, a.beta1, a.beta2);
  LMSCALE_CHECK(a.eps > 0 && std::isfinite(a.lr) && std::isfinite(a.weight_decay) && std::isfinite(a.grad_scale),
                "{}: need eps > 0 and finite lr, weight_decay, grad_scale (got eps={} lr={} wd={} grad_scale={})", op,
                a.eps, a.lr, a.weight_decay, a.grad_scale);
}
}  // namespace

void adamw(Context& ctx, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a,
           Tensor* param_lowp) {
  constexpr const char* op = "ops::adamw";
  const Device dev = detail::common_device(
      op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}, {"param_lowp", param_lowp}});
  detail::check_floating(op, "param", param);
  for (const auto& [name, t] : {detail::NamedTensor{"grad", &grad}, {"m", &m}, {"v", &v}}) {
    detail::check_same_dtype(op, "param", param, name, *t);
    detail::check_numel(op, name, *t, param.numel());
  }
  if (param_lowp) {
    detail::check_floating(op, "param_lowp", *param_lowp);
    detail::check_numel(op, "param_lowp", *param_lowp, param.numel());
  }
  check_step(op, a);
  LMSCALE_CHECK(dev == Device::cuda || !a.device_scalars, "{}: device-resident step scalars are CUDA only", op);
  LMSCALE_CHECK(!a.fp8_casts || (dev == Device::cuda && param_lowp),
                "{}: FP8 weight casts need CUDA and the working copy (param_lowp)", op);
  if (dev == Device::cpu) return cpu::adamw(ctx, param, grad, m, v, a, param_lowp);
#ifdef LMSCALE_WITH_CUDA
  if (a.fp8_casts) return cuda::adamw_fp8(ctx, param, {&grad, nullptr}, m, v, a, *param_lowp);
  return cuda::adamw(ctx, param, grad, m, v, a, param_lowp);
#else
  detail::no_cuda_build(op);
#endif
}

void adamw_pieces(Context& ctx, Tensor& param, const std::vector<GradPiece>& pieces, Tensor& m, Tensor& v,
                  const AdamWStep& a, Tensor* param_lowp) {
  constexpr const char* op = "ops::adamw_pieces";
  std::int64_t next = 0;
  for (const GradPiece& piece : pieces) {
    LMSCALE_CHECK(piece.offset == next, "{}: a piece starts at {} where {} was expected (sorted, no gaps)", op,
                  piece.offset, next);
    next += piece.grad.numel();
  }
  LMSCALE_CHECK(next == param.numel(), "{}: the pieces cover {} of {} elements", op, next, param.numel());
  const std::int64_t n = param.numel();
  LMSCALE_CHECK(m.numel() == n && v.numel() == n && (!param_lowp || param_lowp->numel() == n),
                "{}: m, v (and param_lowp) must have param's {} elements", op, n);
  check_step(op, a);
#ifdef LMSCALE_WITH_CUDA
  if (a.fp8_casts) {
    LMSCALE_CHECK(param.device() == Device::cuda && param_lowp,
                  "{}: FP8 weight casts need CUDA and the working copy (param_lowp)", op);
    return cuda::adamw_fp8(ctx, param, {nullptr, &pieces}, m, v, a, *param_lowp);
  }
  // One launch when the layout allows (the CUDA side checks dtypes, devices and alignment and
  // declines otherwise); else adamw() per piece, with its checks.
  if (param.device() == Device::cuda && cuda::adamw_pieces(ctx, param, pieces, m, v, a, param_lowp)) return;
#endif
  LMSCALE_CHECK(!a.fp8_casts, "{}: FP8 weight casts are CUDA only", op);
  for (const GradPiece& piece : pieces) {
    const std::int64_t k = piece.grad.numel();
    Tensor p = param.flat_range(piece.offset, k), mp = m.flat_range(piece.offset, k), vp = v.flat_range(piece.offset, k);
    Tensor low;
    if (param_lowp) low = param_lowp->flat_range(piece.offset, k);
    Tensor g = piece.grad.reshape({k});
    adamw(ctx, p, g, mp, vp, a, param_lowp ? &low : nullptr);
  }
}

}  // namespace lmscale::ops
