#pragma once
// Row reductions for the CPU kernels, accumulated in double whatever the element type (fp32 data
// then loses nothing to the sum's length). Four independent partial sums keep the FP pipeline busy
// without reassociating beyond a fixed, deterministic order.
#include <cstdint>

namespace lmscale::ops::cpu {

// sum_i x[i]^2
template <class T>
inline double sum_sq_f64(const T* x, std::int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const double a = x[i], b = x[i + 1], c = x[i + 2], d = x[i + 3];
    s0 += a * a;
    s1 += b * b;
    s2 += c * c;
    s3 += d * d;
  }
  for (; i < n; ++i) s0 += static_cast<double>(x[i]) * x[i];
  return (s0 + s1) + (s2 + s3);
}

// sum_i a[i] * b[i] * c[i]
template <class T>
inline double dot3_f64(const T* a, const T* b, const T* c, std::int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += static_cast<double>(a[i]) * b[i] * c[i];
    s1 += static_cast<double>(a[i + 1]) * b[i + 1] * c[i + 1];
    s2 += static_cast<double>(a[i + 2]) * b[i + 2] * c[i + 2];
    s3 += static_cast<double>(a[i + 3]) * b[i + 3] * c[i + 3];
  }
  for (; i < n; ++i) s0 += static_cast<double>(a[i]) * b[i] * c[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace lmscale::ops::cpu
