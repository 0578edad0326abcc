// ops:: momentum SGD, LAMB and trust-ratio norms (lmscale/ops/optimizer_steps.h): shape, dtype,
// device and hyper-parameter checks, then dispatch.
#include "lmscale/ops/optimizer_steps.h"

#include <cmath>

#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"

namespace lmscale::ops {

namespace {

// param and every other tensor: defined, one device, param's dtype and size; lowp floating, same size.
Device check_flat(const char* op, const Tensor& param, std::initializer_list<detail::NamedTensor> others,
                  const Tensor* lowp) {
  const Device dev = detail::common_device(op, {{"param", &param}, {"param_lowp", lowp}});
  detail::check_floating(op, "param", param);
  for (const auto& [name, t] : others) {
    LMSCALE_CHECK(t->defined(), "{}: tensor '{}' has no data", op, name);
    LMSCALE_CHECK(t->device() == dev, "{}: '{}' is on {} but 'param' is on {}", op, name, device_name(t->device()),
                  device_name(dev));
    detail::check_same_dtype(op, "param", param, name, *t);
    detail::check_numel(op, name, *t, param.numel());
  }
  if (lowp) {
    detail::check_floating(op, "param_lowp", *lowp);
    detail::check_numel(op, "param_lowp", *lowp, param.numel());
  }
  return dev;
}

void check_lamb(const char* op, const LambStep& s) {
  LMSCALE_CHECK(s.step >= 1, "{}: step t is 1-based, got {}", op, s.step);
  LMSCALE_CHECK(s.beta1 >= 0 && s.beta1 < 1 && s.beta2 >= 0 && s.beta2 < 1,
                "{}: betas must lie in [0, 1), got beta1={} beta2={}", op, s.beta1, s.beta2);
  LMSCALE_CHECK(s.eps > 0 && std::isfinite(s.lr_ratio) && std::isfinite(s.weight_decay) && std::isfinite(s.grad_scale),
                "{}: need eps > 0 and finite lr_ratio, weight_decay, grad_scale (got eps={} lr_ratio={} wd={} "
                "grad_scale={})",
                op, s.eps, s.lr_ratio, s.weight_decay, s.grad_scale);
}

void check_spans(const char* op, const std::vector<Span>& spans, std::int64_t n) {
  for (const auto& s : spans)
    LMSCALE_CHECK(s.offset >= 0 && s.numel >= 0 && s.offset + s.numel <= n, "{}: span [{}, {}) outside {} elements",
                  op, s.offset, s.offset + s.numel, n);
}

}  // namespace

void momentum_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& buf, const MomentumStep& s,
                     Tensor* param_lowp) {
  constexpr const char* op = "ops::momentum_update";
  const Device dev = check_flat(op, param, {{"grad", &grad}, {"buf", &buf}}, param_lowp);
  LMSCALE_CHECK(s.momentum >= 0 && s.momentum < 1, "{}: momentum must lie in [0, 1), got {}", op, s.momentum);
  LMSCALE_CHECK(std::isfinite(s.coeff) && std::isfinite(s.step) && std::isfinite(s.weight_decay) &&
                    std::isfinite(s.grad_scale),
                "{}: need finite coeff, step, weight_decay, grad_scale (got {} {} {} {})", op, s.coeff, s.step,
                s.weight_decay, s.grad_scale);
  if (dev == Device::cpu) return cpu::momentum_update(ctx, param, grad, buf, s, param_lowp);
#ifdef LMSCALE_WITH_CUDA
  return cuda::momentum_update(ctx, param, grad, buf, s, param_lowp);
#else
  detail::no_cuda_build(op);
#endif
}

void lamb_moments(Context& ctx, const Tensor& grad, Tensor& m, Tensor& v, const LambStep& s) {
  constexpr const char* op = "ops::lamb_moments";
  const Device dev = check_flat(op, grad, {{"m", &m}, {"v", &v}}, nullptr);
  check_lamb(op, s);
  if (dev == Device::cpu) return cpu::lamb_moments(ctx, grad, m, v, s);
#ifdef LMSCALE_WITH_CUDA
  return cuda::lamb_moments(ctx, grad, m, v, s);
#else
  detail::no_cuda_build(op);
#endif
}

void lamb_update(Context& ctx, Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s, Tensor* param_lowp) {
  constexpr const char* op = "ops::lamb_update";
  const Device dev = check_flat(op, param, {{"m", &m}, {"v", &v}}, param_lowp);
  check_lamb(op, s);
  if (dev == Device::cpu) return cpu::lamb_update(ctx, param, m, v, s, param_lowp);
#ifdef LMSCALE_WITH_CUDA
  return cuda::lamb_update(ctx, param, m, v, s, param_lowp);
#else
  detail::no_cuda_build(op);
#endif
}

std::vector<double> lars_norms(Context& ctx, const Tensor& param, const Tensor& grad, double grad_scale,
                               const std::vector<Span>& spans) {
  constexpr const char* op = "ops::lars_norms";
  const Device dev = check_flat(op, param, {{"grad", &grad}}, nullptr);
  check_spans(op, spans, param.numel());
  if (spans.empty()) return {};
  if (dev == Device::cpu) return cpu::lars_norms(ctx, param, grad, grad_scale, spans);
#ifdef LMSCALE_WITH_CUDA
  return cuda::lars_norms(ctx, param, grad, grad_scale, spans);
#else
  detail::no_cuda_build(op);
#endif
}

std::vector<double> lamb_norms(Context& ctx, const Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s,
                               const std::vector<Span>& spans) {
  constexpr const char* op = "ops::lamb_norms";
  const Device dev = check_flat(op, param, {{"m", &m}, {"v", &v}}, nullptr);
  check_lamb(op, s);
  check_spans(op, spans, param.numel());
  if (spans.empty()) return {};
  if (dev == Device::cpu) return cpu::lamb_norms(ctx, param, m, v, s, spans);
#ifdef LMSCALE_WITH_CUDA
  return cuda::lamb_norms(ctx, param, m, v, s, spans);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
