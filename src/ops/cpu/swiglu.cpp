// SwiGLU gate on the CPU, elementwise: h = silu(a) * b with silu(a) = a * sigmoid(a).
// Backward: da = dh * b * sigmoid(a) * (1 + a * (1 - sigmoid(a))),  db = dh * silu(a).
// Each element reads its inputs before writing, so da/db may alias a/b/dh element for element.
#include <cmath>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {
namespace {

// 1 / (1 + e^-a): exp overflows to inf for a << 0 and the result goes to 0 without a NaN.
template <class T>
inline T sigmoid(T a) {
  return T(1) / (T(1) + std::exp(-a));
}

}  // namespace

void swiglu(Context&, const Tensor& a, const Tensor& b, Tensor& h) {
  dispatch_real("ops::swiglu", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ap = a.data_as<T>();
    const T* bp = b.data_as<T>();
    T* hp = h.data_as<T>();
    const std::int64_t n = a.numel();
    for (std::int64_t i = 0; i < n; ++i) hp[i] = ap[i] * sigmoid(ap[i]) * bp[i];
  });
}

void swiglu_backward(Context&, const Tensor& a, const Tensor& b, const Tensor& dh, Tensor& da, Tensor& db) {
  dispatch_real("ops::swiglu_backward", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ap = a.data_as<T>();
    const T* bp = b.data_as<T>();
    const T* gp = dh.data_as<T>();
    T* dap = da.data_as<T>();
    T* dbp = db.data_as<T>();
    const std::int64_t n = a.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      const T av = ap[i], bv = bp[i], g = gp[i];
      const T s = sigmoid(av);
      dap[i] = g * bv * s * (T(1) + av * (T(1) - s));
      dbp[i] = g * av * s;
    }
  });
}

}  // namespace lmscale::ops::cpu
