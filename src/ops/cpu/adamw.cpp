// AdamW on the CPU, one fused pass over the elements in the order of docs/architecture.md §2:
//   p -= lr * wd * p                                  (decoupled weight decay, first)
//   g  = grad * grad_scale
//   m  = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
// The per-step scalars are computed in double and applied in the element type (fp32 or fp64).
// param_lowp, when given, receives the new p converted to its dtype (one rounding).
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {
namespace {

// Scalars of one step, in the element type T.
template <class T>
struct StepScalars {
  T decay, grad_scale, b1, c1, b2, c2, eps, step_size;
};

// The fused loop. L is the dtype of the low-precision copy, or std::nullptr_t for none.
template <class T, class L>
void adamw_loop(std::int64_t n, T* p, const T* g, T* mp, T* vp, L* lp, const StepScalars<T>& s) {
  for (std::int64_t i = 0; i < n; ++i) {
    T pi = p[i];
    pi -= s.decay * pi;
    const T gi = g[i] * s.grad_scale;
    const T mi = s.b1 * mp[i] + s.c1 * gi;
    const T vi = s.b2 * vp[i] + s.c2 * gi * gi;
    pi -= s.step_size * mi / (std::sqrt(vi) + s.eps);
    p[i] = pi;
    mp[i] = mi;
    vp[i] = vi;
    if constexpr (!std::is_same_v<L, std::nullptr_t>) {
      if constexpr (std::is_same_v<T, double>) {
        lp[i] = store_from_f64<L>(pi);
      } else {
        lp[i] = store_from_f32<L>(pi);
      }
    }
  }
}

}  // namespace

void adamw(Context&, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a,
           Tensor* param_lowp) {
  constexpr const char* op = "ops::adamw";
  const std::int64_t n = param.numel();
  const double t = static_cast<double>(a.step);
  const double step_size = a.lr * std::sqrt(1.0 - std::pow(a.beta2, t)) / (1.0 - std::pow(a.beta1, t));
  dispatch_real(op, param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const StepScalars<T> s{static_cast<T>(a.lr * a.weight_decay), static_cast<T>(a.grad_scale),
                           static_cast<T>(a.beta1),               static_cast<T>(1.0 - a.beta1),
                           static_cast<T>(a.beta2),               static_cast<T>(1.0 - a.beta2),
                           static_cast<T>(a.eps),                 static_cast<T>(step_size)};
    T* p = param.data_as<T>();
    T* mp = m.data_as<T>();
    T* vp = v.data_as<T>();
    const T* g = grad.data_as<T>();
    if (!param_lowp) return adamw_loop<T, std::nullptr_t>(n, p, g, mp, vp, nullptr, s);
    dispatch_floating(op, param_lowp->dtype(), [&](auto low_tag) {
      using L = decltype(low_tag);
      adamw_loop<T, L>(n, p, g, mp, vp, param_lowp->data_as<L>(), s);
    });
  });
}

}  // namespace lmscale::ops::cpu
