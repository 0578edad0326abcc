// RMSNorm on the CPU, per row of d:  r = 1/sqrt(mean(x^2) + eps),  y = (x * r) * w.
// Backward, with s = sum_j dy_j w_j x_j:
//   dx_k = r w_k dy_k - (r^3 / d) x_k s          (overwrites)
//   dw_k += sum over rows of dy_k x_k r          (accumulates)
// Row sums accumulate in double; r is saved in the element type (fp32 or fp64).
#include <cmath>
#include <vector>

#include "cpu_ops.h"
#include "dtype_dispatch.h"
#include "producer_amax.h"
#include "reduce.h"

namespace lmscale::ops::cpu {
namespace {

void check_one_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const DType t0 = (*ts.begin())->dtype();
  for (const Tensor* t : ts) {
    LMSCALE_CHECK(t->dtype() == t0, "{}: on CPU x, w, y/dy, dx, dw and rstd share one dtype; got {} and {}", op,
                  dtype_name(t0), dtype_name(t->dtype()));
  }
}

}  // namespace

void rmsnorm(Context&, const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd, Tensor* y_amax) {
  constexpr const char* op = "ops::rmsnorm";
  check_one_dtype(op, {&x, &w, &y, &rstd});
  const std::int64_t d = x.dim(-1), rows = rstd.numel();
  ProducerAmax amax(y_amax);
  dispatch_real(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* wp = w.data_as<T>();
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* xr = x.data_as<T>() + n * d;
      T* yr = y.data_as<T>() + n * d;
      const T r = static_cast<T>(1.0 / std::sqrt(sum_sq_f64(xr, d) / static_cast<double>(d) + eps));
      rstd.data_as<T>()[n] = r;
      for (std::int64_t j = 0; j < d; ++j) {
        yr[j] = (xr[j] * r) * wp[j];
        amax.add(yr[j]);
      }
    }
  });
  amax.store();
}

void rmsnorm_backward(Context&, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                      Tensor& dw, bool accumulate_dx, Tensor* dx_amax) {
  constexpr const char* op = "ops::rmsnorm_backward";
  check_one_dtype(op, {&x, &w, &rstd, &dy, &dx, &dw});
  const std::int64_t d = x.dim(-1), rows = rstd.numel();
  ProducerAmax amax(dx_amax);
  dispatch_real(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* wp = w.data_as<T>();
    std::vector<double> dw_acc(static_cast<std::size_t>(d), 0.0);   // [d], summed over rows in order
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* xr = x.data_as<T>() + n * d;
      const T* gr = dy.data_as<T>() + n * d;
      T* dxr = dx.data_as<T>() + n * d;
      const double r = rstd.data_as<T>()[n];
      const double s = dot3_f64(gr, wp, xr, d);
      const T c = static_cast<T>(r * r * r * s / static_cast<double>(d));
      const T rt = static_cast<T>(r);
      for (std::int64_t j = 0; j < d; ++j) {
        const T g = gr[j], xv = xr[j];
        dw_acc[static_cast<std::size_t>(j)] += static_cast<double>(g) * (xv * rt);
        const T v = rt * wp[j] * g - c * xv;   // rounded as a separate output would be, then added
        dxr[j] = accumulate_dx ? dxr[j] + v : v;
        amax.add(dxr[j]);
      }
    }
    T* dwp = dw.data_as<T>();
    for (std::int64_t j = 0; j < d; ++j) dwp[j] += static_cast<T>(dw_acc[static_cast<std::size_t>(j)]);
  });
  amax.store();
}

}  // namespace lmscale::ops::cpu
