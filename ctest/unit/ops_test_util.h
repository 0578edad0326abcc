#pragma once
// Helpers for the CPU op tests (test_ops_*.cpp): a fixture with a host allocator and Context,
// random and poisoned tensors, fp64 <-> fp32 copies, and comparisons.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "lmscale/core/allocator.h"
#include "lmscale/core/context.h"
#include "lmscale/core/rng.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/ops.h"
#include "gradcheck.h"

namespace lmscale::test {

class OpsTest : public ::testing::Test {
 protected:
  OpsTest() {
    ctx.device = Device::cpu;
    ctx.allocator = &alloc;
    ctx.host = &alloc;
  }

  // Uninitialised tensor filled with NaN (float dtypes) so a kernel that skips an element shows.
  Tensor poisoned(const Shape& shape, DType dtype = DType::f64) {
    Tensor t = Tensor::empty(shape, dtype, alloc, "test");
    if (is_floating(dtype)) ops::fill(ctx, t, std::numeric_limits<double>::quiet_NaN());
    return t;
  }
  Tensor full(const Shape& shape, double value, DType dtype = DType::f64) {
    Tensor t = Tensor::empty(shape, dtype, alloc, "test");
    ops::fill(ctx, t, value);
    return t;
  }
  Tensor zeros(const Shape& shape, DType dtype = DType::f64) { return full(shape, 0.0, dtype); }
  // Normal(mean, stddev) from a counter RNG keyed by `seed`.
  Tensor randn(const Shape& shape, std::uint64_t seed, double stddev = 1.0, double mean = 0.0,
               DType dtype = DType::f64) {
    Tensor t64 = Tensor::empty(shape, DType::f64, alloc, "test");
    const CounterRng rng(seed, 77);
    double* p = t64.data_as<double>();
    for (std::int64_t i = 0; i < t64.numel(); ++i) p[i] = mean + stddev * rng.normal(static_cast<std::uint64_t>(i));
    return dtype == DType::f64 ? t64 : as(t64, dtype);
  }
  Tensor ids(const Shape& shape, const std::vector<std::int32_t>& values) {
    Tensor t = Tensor::empty(shape, DType::i32, alloc, "test");
    EXPECT_EQ(static_cast<std::int64_t>(values.size()), t.numel());
    std::copy(values.begin(), values.end(), t.data_as<std::int32_t>());
    return t;
  }
  // A converted copy.
  Tensor as(const Tensor& src, DType dtype) {
    Tensor t = Tensor::empty(src.shape(), dtype, alloc, "test");
    ops::cast(ctx, src, t);
    return t;
  }
  Tensor clone(const Tensor& src) { return as(src, src.dtype()); }

  HostAllocator alloc;
  Context ctx;
};

// Elements as doubles (fp32 or fp64 tensors).
inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    v[static_cast<std::size_t>(i)] = t.dtype() == DType::f64 ? t.data_as<double>()[i] : t.data_as<float>()[i];
  }
  return v;
}

// sum_i a_i b_i in double (fp32 or fp64 tensors): the scalar loss f = <y, r> whose gradient with
// respect to y is r, turning an op with tensor output into a scalar function for gradcheck.
inline double dot(const Tensor& a, const Tensor& b) {
  const auto va = values(a), vb = values(b);
  EXPECT_EQ(va.size(), vb.size());
  double s = 0;
  for (std::size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

// max_i |a_i - ref_i| / max_i |ref_i|: the normwise relative error of a against ref (NaN -> inf).
inline double max_rel_diff(const Tensor& a, const Tensor& ref) {
  const auto va = values(a), vr = values(ref);
  EXPECT_EQ(va.size(), vr.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double d = std::fabs(va[i] - vr[i]);
    if (std::isnan(d)) return INFINITY;
    num = std::max(num, d);
    den = std::max(den, std::fabs(vr[i]));
  }
  return den > 0 ? num / den : num;
}

// Prints the one-line summary (so logs show how close each check came) and expects success.
inline void expect_gradcheck_ok(const GradCheckResult& r) {
  std::printf("%s\n", r.summary().c_str());
  EXPECT_TRUE(r.ok) << r.report();
}

}  // namespace lmscale::test
