// Momentum SGD, LAMB and the trust-ratio norms on the CPU (lmscale/ops/optimizer_steps.h), one
// fused loop each, in the order of the formulas there. Per-step scalars are computed in double
// and applied in the element type (fp32 or fp64: the fp64 path is the tests' reference); norms
// accumulate in double. param_lowp, when given, receives the new p rounded once to its dtype.
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {
namespace {

template <class T, class L>
inline void store_lowp(L* lp, std::int64_t i, T x) {
  if constexpr (!std::is_same_v<L, std::nullptr_t>) {
    if constexpr (std::is_same_v<T, double>) lp[i] = store_from_f64<L>(x);
    else lp[i] = store_from_f32<L>(x);
  }
}

// Calls f(T tag, L* lowp) with L the low-precision dtype, or std::nullptr_t without a copy.
template <class T, class F>
void with_lowp(const char* op, Tensor* lowp, F&& f) {
  if (!lowp) return f(static_cast<std::nullptr_t*>(nullptr));
  dispatch_floating(op, lowp->dtype(), [&](auto low_tag) {
    using L = decltype(low_tag);
    f(lowp->data_as<L>());
  });
}

// LAMB's per-step scalars: bias corrections 1/(1-b^t).
struct LambScalars {
  double inv_c1, inv_c2;
  explicit LambScalars(const LambStep& s)
      : inv_c1(1.0 / (1.0 - std::pow(s.beta1, static_cast<double>(s.step)))),
        inv_c2(1.0 / (1.0 - std::pow(s.beta2, static_cast<double>(s.step)))) {}
};

}  // namespace

void momentum_update(Context&, Tensor& param, const Tensor& grad, Tensor& buf, const MomentumStep& s,
                     Tensor* param_lowp) {
  constexpr const char* op = "ops::momentum_update";
  const std::int64_t n = param.numel();
  dispatch_real(op, param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T mu = static_cast<T>(s.momentum), wd = static_cast<T>(s.weight_decay), gs = static_cast<T>(s.grad_scale),
            c = static_cast<T>(s.coeff), st = static_cast<T>(s.step);
    T* p = param.data_as<T>();
    T* b = buf.data_as<T>();
    const T* g = grad.data_as<T>();
    with_lowp<T>(op, param_lowp, [&](auto* lp) {
      using L = std::remove_pointer_t<decltype(lp)>;
      for (std::int64_t i = 0; i < n; ++i) {
        const T gi = g[i] * gs + wd * p[i];
        const T bi = mu * b[i] + c * gi;
        const T d = s.nesterov ? c * gi + mu * bi : bi;
        b[i] = bi;
        p[i] -= st * d;
        store_lowp<T, L>(lp, i, p[i]);
      }
    });
  });
}

void lamb_moments(Context&, const Tensor& grad, Tensor& m, Tensor& v, const LambStep& s) {
  dispatch_real("ops::lamb_moments", grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T b1 = static_cast<T>(s.beta1), c1 = static_cast<T>(1.0 - s.beta1), b2 = static_cast<T>(s.beta2),
            c2 = static_cast<T>(1.0 - s.beta2), gs = static_cast<T>(s.grad_scale);
    const T* g = grad.data_as<T>();
    T* mp = m.data_as<T>();
    T* vp = v.data_as<T>();
    for (std::int64_t i = 0, n = grad.numel(); i < n; ++i) {
      const T gi = g[i] * gs;
      mp[i] = b1 * mp[i] + c1 * gi;
      vp[i] = b2 * vp[i] + c2 * gi * gi;
    }
  });
}

void lamb_update(Context&, Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s, Tensor* param_lowp) {
  constexpr const char* op = "ops::lamb_update";
  const LambScalars k(s);
  dispatch_real(op, param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T ic1 = static_cast<T>(k.inv_c1), ic2 = static_cast<T>(k.inv_c2), eps = static_cast<T>(s.eps),
            wd = static_cast<T>(s.weight_decay), lr = static_cast<T>(s.lr_ratio);
    T* p = param.data_as<T>();
    const T* mp = m.data_as<T>();
    const T* vp = v.data_as<T>();
    with_lowp<T>(op, param_lowp, [&](auto* lp) {
      using L = std::remove_pointer_t<decltype(lp)>;
      for (std::int64_t i = 0, n = param.numel(); i < n; ++i) {
        const T r = (mp[i] * ic1) / (std::sqrt(vp[i] * ic2) + eps);
        p[i] -= lr * (r + wd * p[i]);
        store_lowp<T, L>(lp, i, p[i]);
      }
    });
  });
}

std::vector<double> lars_norms(Context&, const Tensor& param, const Tensor& grad, double grad_scale,
                               const std::vector<Span>& spans) {
  std::vector<double> out(2 * spans.size(), 0.0);
  dispatch_real("ops::lars_norms", param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = param.data_as<T>();
    const T* g = grad.data_as<T>();
    const T gs = static_cast<T>(grad_scale);
    for (std::size_t s = 0; s < spans.size(); ++s) {
      double pp = 0, gg = 0;
      for (std::int64_t i = spans[s].offset, e = i + spans[s].numel; i < e; ++i) {
        const double pi = p[i], gi = static_cast<T>(g[i] * gs);
        pp += pi * pi;
        gg += gi * gi;
      }
      out[2 * s] = pp;
      out[2 * s + 1] = gg;
    }
  });
  return out;
}

std::vector<double> lamb_norms(Context&, const Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s,
                               const std::vector<Span>& spans) {
  std::vector<double> out(3 * spans.size(), 0.0);
  const LambScalars k(s);
  dispatch_real("ops::lamb_norms", param.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T ic1 = static_cast<T>(k.inv_c1), ic2 = static_cast<T>(k.inv_c2), eps = static_cast<T>(s.eps);
    const T* p = param.data_as<T>();
    const T* mp = m.data_as<T>();
    const T* vp = v.data_as<T>();
    for (std::size_t j = 0; j < spans.size(); ++j) {
      double pp = 0, rr = 0, rp = 0;
      for (std::int64_t i = spans[j].offset, e = i + spans[j].numel; i < e; ++i) {
        const double pi = p[i];
        const double r = static_cast<T>((mp[i] * ic1) / (std::sqrt(vp[i] * ic2) + eps));
        pp += pi * pi;
        rr += r * r;
        rp += r * pi;
      }
      out[3 * j] = pp;
      out[3 * j + 1] = rr;
      out[3 * j + 2] = rp;
    }
  });
  return out;
}

}  // namespace lmscale::ops::cpu
