// ops::rmsnorm / rmsnorm_backward on the CPU: forward and rstd against the formula, dx and dw by
// central differences, dw accumulation, fp32 vs fp64, bad arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using RmsNormTest = OpsTest;
constexpr double kEps = 1e-5;

TEST_F(RmsNormTest, ForwardMatchesFormula) {
  const std::int64_t N = 3, d = 7;
  Tensor x = randn({N, d}, 1), w = randn({d}, 2, 0.3, 1.0), y = poisoned({N, d}), rstd = poisoned({N});
  ops::rmsnorm(ctx, x, w, kEps, y, rstd);
  const auto xv = values(x), wv = values(w), yv = values(y), rv = values(rstd);
  for (std::int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (std::int64_t j = 0; j < d; ++j) ms += xv[n * d + j] * xv[n * d + j] / d;
    const double r = 1.0 / std::sqrt(ms + kEps);
    EXPECT_NEAR(rv[n], r, 1e-14 * r);
    for (std::int64_t j = 0; j < d; ++j) EXPECT_NEAR(yv[n * d + j], xv[n * d + j] * r * wv[j], 1e-14) << n << "," << j;
  }
}

TEST_F(RmsNormTest, BackwardMatchesFiniteDifferences) {
  const std::int64_t d = 6;
  Tensor x = randn({2, 2, d}, 3), w = randn({d}, 4, 0.3, 1.0), r = randn({2, 2, d}, 5);
  Tensor y = poisoned({2, 2, d}), rstd = poisoned({4});
  ops::rmsnorm(ctx, x, w, kEps, y, rstd);
  Tensor dx = poisoned({2, 2, d}), dw = zeros({d});
  ops::rmsnorm_backward(ctx, x, w, rstd, r, dx, dw);
  const auto f = [&] {
    ops::rmsnorm(ctx, x, w, kEps, y, rstd);
    return dot(y, r);
  };
  expect_gradcheck_ok(gradcheck(f, {{"x", &x, &dx}, {"w", &w, &dw}}));
}

TEST_F(RmsNormTest, SmallRowsFeelEps) {
  // Rows near zero make eps matter; the gradient must still match.
  const std::int64_t d = 4;
  Tensor x = randn({2, d}, 6, 3e-3), w = randn({d}, 7, 0.3, 1.0), r = randn({2, d}, 8);
  Tensor y = poisoned({2, d}), rstd = poisoned({2}), dx = poisoned({2, d}), dw = zeros({d});
  ops::rmsnorm(ctx, x, w, kEps, y, rstd);
  ops::rmsnorm_backward(ctx, x, w, rstd, r, dx, dw);
  const auto f = [&] {
    ops::rmsnorm(ctx, x, w, kEps, y, rstd);
    return dot(y, r);
  };
  GradCheckOptions opt;
  opt.h = 1e-8;   // x ~ 3e-3: a smaller step keeps the truncation error below 1e-6 relative
  expect_gradcheck_ok(gradcheck(f, {{"x", &x, &dx}, {"w", &w, &dw}}, opt));
}

TEST_F(RmsNormTest, DwAccumulates) {
  const std::int64_t d = 5;
  Tensor x = randn({3, d}, 9), w = randn({d}, 10), dy = randn({3, d}, 11), y = poisoned({3, d}), rstd = poisoned({3});
  ops::rmsnorm(ctx, x, w, kEps, y, rstd);
  Tensor dx = poisoned({3, d}), dw0 = zeros({d}), base = randn({d}, 12), dw1 = clone(base);
  ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw0);
  ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw1);
  for (std::int64_t j = 0; j < d; ++j) {
    EXPECT_NEAR(dw1.data_as<double>()[j], base.data_as<double>()[j] + dw0.data_as<double>()[j], 1e-14);
  }
}

// accumulate_dx adds the input gradient to what dx holds: bitwise dx0 + (the overwriting result),
// in fp32 as the model uses it for the residual stream; add_rmsnorm is add then rmsnorm, bitwise.
TEST_F(RmsNormTest, AccumulatingBackwardAndFusedAdd) {
  const std::int64_t N = 4, d = 9;
  Tensor x = as(randn({N, d}, 40), DType::f32), w = as(randn({d}, 41, 0.3, 1.0), DType::f32);
  Tensor dy = as(randn({N, d}, 42), DType::f32), rstd = poisoned({N}, DType::f32), y = poisoned({N, d}, DType::f32);
  ops::rmsnorm(ctx, x, w, kEps, y, rstd);
  Tensor dx_fresh = poisoned({N, d}, DType::f32), dw1 = as(zeros({d}), DType::f32), dw2 = as(zeros({d}), DType::f32);
  ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx_fresh, dw1);
  Tensor dx0 = as(randn({N, d}, 43), DType::f32), dx_acc = clone(dx0);
  ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx_acc, dw2, true);
  Tensor want = poisoned({N, d}, DType::f32);
  ops::add(ctx, dx0, dx_fresh, want);
  EXPECT_EQ(values(dx_acc), values(want));
  EXPECT_EQ(values(dw2), values(dw1));   // the weight gradient is the same either way

  Tensor a = as(randn({N, d}, 44), DType::f32), b = as(randn({N, d}, 45), DType::f32);
  Tensor sum = poisoned({N, d}, DType::f32), yf = poisoned({N, d}, DType::f32), rf = poisoned({N}, DType::f32);
  ops::add_rmsnorm(ctx, a, b, w, kEps, sum, yf, rf);
  Tensor sum2 = poisoned({N, d}, DType::f32), y2 = poisoned({N, d}, DType::f32), r2 = poisoned({N}, DType::f32);
  ops::add(ctx, a, b, sum2);
  ops::rmsnorm(ctx, sum2, w, kEps, y2, r2);
  EXPECT_EQ(values(sum), values(sum2));
  EXPECT_EQ(values(yf), values(y2));
  EXPECT_EQ(values(rf), values(r2));
  Tensor bad = poisoned({N, d + 1}, DType::f32);
  EXPECT_THROW(ops::add_rmsnorm(ctx, a, bad, w, kEps, sum, yf, rf), Error);
}

TEST_F(RmsNormTest, Fp32AgreesWithFp64) {
  const std::int64_t N = 5, d = 64;
  Tensor x = randn({N, d}, 13), w = randn({d}, 14, 0.3, 1.0), dy = randn({N, d}, 15);
  Tensor y = poisoned({N, d}), rstd = poisoned({N}), dx = poisoned({N, d}), dw = zeros({d});
  ops::rmsnorm(ctx, x, w, kEps, y, rstd);
  ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw);
  Tensor x32 = as(x, DType::f32), w32 = as(w, DType::f32), dy32 = as(dy, DType::f32);
  Tensor y32 = poisoned({N, d}, DType::f32), rstd32 = poisoned({N}, DType::f32);
  Tensor dx32 = poisoned({N, d}, DType::f32), dw32 = zeros({d}, DType::f32);
  ops::rmsnorm(ctx, x32, w32, kEps, y32, rstd32);
  ops::rmsnorm_backward(ctx, x32, w32, rstd32, dy32, dx32, dw32);
  EXPECT_LT(max_rel_diff(y32, y), 1e-5);
  EXPECT_LT(max_rel_diff(rstd32, rstd), 1e-6);
  EXPECT_LT(max_rel_diff(dx32, dx), 1e-5);
  EXPECT_LT(max_rel_diff(dw32, dw), 1e-5);
}

TEST_F(RmsNormTest, BadArgumentsThrow) {
  Tensor x = randn({2, 4}, 16), w = randn({4}, 17), y = poisoned({2, 4}), rstd = poisoned({2});
  Tensor w_bad = randn({5}, 18);
  EXPECT_THROW(ops::rmsnorm(ctx, x, w_bad, kEps, y, rstd), Error);
  Tensor rstd_bad = poisoned({3});
  EXPECT_THROW(ops::rmsnorm(ctx, x, w, kEps, y, rstd_bad), Error);
  Tensor rstd32 = poisoned({2}, DType::f32);
  EXPECT_THROW(ops::rmsnorm(ctx, x, w, kEps, y, rstd32), Error);   // fp64 x keeps an fp64 rstd
  Tensor y_bad = poisoned({4, 2});
  EXPECT_THROW(ops::rmsnorm(ctx, x, w, kEps, y_bad, rstd), Error);
  EXPECT_THROW(ops::rmsnorm(ctx, x, w, -1.0, y, rstd), Error);
  Tensor xb = as(x, DType::bf16), wb = as(w, DType::bf16), yb = poisoned({2, 4}, DType::bf16);
  Tensor rs = poisoned({2}, DType::f32);
  EXPECT_THROW(ops::rmsnorm(ctx, xb, wb, kEps, yb, rs), Error);   // mixed precision is CUDA-only
}

}  // namespace
}  // namespace lmscale::test
