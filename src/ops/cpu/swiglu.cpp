// SwiGLU gate on the CPU, elementwise: h = silu(a) * b with silu(a) = a * sigmoid(a).
// Backward: da = dh * b * sigmoid(a) * (1 + a * (1 - sigmoid(a))),  db = dh * silu(a).
// Each element reads its inputs before writing, so da/db may alias a/b/dh element for element.
// a, b, da, db are [rows, cols] blocks of rows ld elements apart; h and dh are contiguous.
#include <cmath>

#include "cpu_ops.h"
#include "dtype_dispatch.h"
#include "producer_amax.h"

namespace lmscale::ops::cpu {
namespace {

// 1 / (1 + e^-a): exp overflows to inf for a << 0 and the result goes to 0 without a NaN.
template <class T>
inline T sigmoid(T a) {
  return T(1) / (T(1) + std::exp(-a));
}

}  // namespace

void swiglu(Context&, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols, std::int64_t ld,
            Tensor& h, Tensor* h_amax) {
  ProducerAmax amax(h_amax);
  dispatch_real("ops::swiglu", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ap = a.data_as<T>();
    const T* bp = b.data_as<T>();
    T* hp = h.data_as<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* ar = ap + r * ld;
      const T* br = bp + r * ld;
      T* hr = hp + r * cols;
      for (std::int64_t c = 0; c < cols; ++c) {
        hr[c] = ar[c] * sigmoid(ar[c]) * br[c];
        amax.add(hr[c]);
      }
    }
  });
  amax.store();
}

void swiglu_backward(Context&, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                     std::int64_t ld, const Tensor& dh, Tensor& da, Tensor& db, Tensor* dab_amax) {
  ProducerAmax amax(dab_amax);
  dispatch_real("ops::swiglu_backward", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ap = a.data_as<T>();
    const T* bp = b.data_as<T>();
    const T* gp = dh.data_as<T>();
    T* dap = da.data_as<T>();
    T* dbp = db.data_as<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t i = r * ld + c;   // a, b, da, db; dh is contiguous
        const T av = ap[i], bv = bp[i], g = gp[r * cols + c];
        const T s = sigmoid(av);
        dap[i] = g * bv * s * (T(1) + av * (T(1) - s));
        dbp[i] = g * av * s;
        amax.add(dap[i]);
        amax.add(dbp[i]);
      }
    }
  });
  amax.store();
}

}  // namespace lmscale::ops::cpu
