// The gradient checker itself (gradcheck.h): passes a correct gradient, fails a slightly wrong
// one, restores the inputs bit for bit, and samples big tensors deterministically.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

class GradCheckTest : public OpsTest {
 protected:
  // f(x, y) = sum_i sin(x_i) * y_i + 0.5 * sum_i y_i^2; df/dx = cos(x) y, df/dy = sin(x) + y.
  double f() const {
    double s = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double xi = x.data_as<double>()[i], yi = y.data_as<double>()[i];
      s += std::sin(xi) * yi + 0.5 * yi * yi;
    }
    return s;
  }
  void analytic() {
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double xi = x.data_as<double>()[i], yi = y.data_as<double>()[i];
      dx.data_as<double>()[i] = std::cos(xi) * yi;
      dy.data_as<double>()[i] = std::sin(xi) + yi;
    }
  }
  Tensor x = randn({3, 4}, 1), y = randn({3, 4}, 2), dx = zeros({3, 4}), dy = zeros({3, 4});
};

TEST_F(GradCheckTest, CorrectGradientPasses) {
  analytic();
  const Tensor x_before = clone(x);
  const auto r = gradcheck([&] { return f(); }, {{"x", &x, &dx}, {"y", &y, &dy}});
  EXPECT_TRUE(r.ok) << r.report();
  EXPECT_EQ(r.checked, 24);
  EXPECT_LT(r.max_error, 1.0);
  EXPECT_EQ(std::memcmp(x.data(), x_before.data(), x.nbytes()), 0) << "inputs must be restored exactly";
}

TEST_F(GradCheckTest, SlightlyWrongGradientFails) {
  analytic();
  dx.data_as<double>()[5] *= 1.0 + 1e-4;   // one element off by 1e-4 relative
  const auto r = gradcheck([&] { return f(); }, {{"x", &x, &dx}, {"y", &y, &dy}});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed, 1) << r.report();
  EXPECT_NE(r.failures.find("x[5]"), std::string::npos) << r.report();
}

TEST_F(GradCheckTest, NaNGradientFails) {
  analytic();
  dy.data_as<double>()[0] = std::nan("");
  const auto r = gradcheck([&] { return f(); }, {{"x", &x, &dx}, {"y", &y, &dy}});
  EXPECT_FALSE(r.ok) << r.report();
}

TEST_F(GradCheckTest, SubsetIsDeterministicAndIncludesEnds) {
  GradCheckOptions opt;
  opt.max_elements = 5;
  const auto a = detail::gradcheck_indices(1000, "w", opt), b = detail::gradcheck_indices(1000, "w", opt);
  EXPECT_EQ(a, b);
  ASSERT_GE(a.size(), 3u);
  EXPECT_LE(a.size(), 5u);
  EXPECT_EQ(a.front(), 0);
  EXPECT_EQ(a.back(), 999);
  analytic();
  const auto r = gradcheck([&] { return f(); }, {{"x", &x, &dx}}, opt);
  EXPECT_TRUE(r.ok) << r.report();
  EXPECT_LE(r.checked, 5);
}

TEST_F(GradCheckTest, RejectsNonFp64) {
  Tensor x32 = as(x, DType::f32);
  analytic();
  EXPECT_THROW(gradcheck([&] { return f(); }, {{"x", &x32, &dx}}), Error);
}

}  // namespace
}  // namespace lmscale::test
