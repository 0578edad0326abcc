// ops::rope on the CPU: elements against the direct formula, inverse undoes forward, the backward
// (= inverse) by central differences, position 0 untouched, fp32 vs fp64, bad arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using RopeTest = OpsTest;
constexpr std::int64_t B = 2, T = 5, H = 3, Dh = 8;

std::int64_t at(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t e) { return ((b * T + t) * H + h) * Dh + e; }

TEST_F(RopeTest, MatchesDirectFormula) {
  for (double theta : {10000.0, 10.0}) {
    Tensor x = randn({B, T, H, Dh}, 1), y = clone(x);
    ops::rope(ctx, y, B, T, H, Dh, theta, false);
    const auto xv = values(x), yv = values(y);
    // A few (b, t, h, i) picked by hand, including the last pair and the last position.
    for (auto [b, t, h, i] : {std::array<std::int64_t, 4>{0, 1, 0, 0}, {1, 4, 2, 3}, {0, 3, 1, 1}, {1, 2, 0, 2}}) {
      const double angle = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / Dh);
      const double x0 = xv[at(b, t, h, 2 * i)], x1 = xv[at(b, t, h, 2 * i + 1)];
      EXPECT_NEAR(yv[at(b, t, h, 2 * i)], x0 * std::cos(angle) - x1 * std::sin(angle), 1e-14);
      EXPECT_NEAR(yv[at(b, t, h, 2 * i + 1)], x0 * std::sin(angle) + x1 * std::cos(angle), 1e-14);
    }
    // Position 0 rotates by angle 0; pair 0 at t=1 by exactly 1 radian.
    for (std::int64_t e = 0; e < Dh; ++e) EXPECT_EQ(yv[at(1, 0, 2, e)], xv[at(1, 0, 2, e)]);
    EXPECT_NEAR(yv[at(0, 1, 1, 0)], xv[at(0, 1, 1, 0)] * std::cos(1.0) - xv[at(0, 1, 1, 1)] * std::sin(1.0), 1e-15);
  }
}

TEST_F(RopeTest, InverseUndoesForward) {
  Tensor x = randn({B, T, H, Dh}, 2), y = clone(x);
  ops::rope(ctx, y, B, T, H, Dh, 10000.0, false);
  EXPECT_GT(max_rel_diff(y, x), 1e-2);   // it did rotate
  ops::rope(ctx, y, B, T, H, Dh, 10000.0, true);
  EXPECT_LT(max_rel_diff(y, x), 1e-15);
  ops::rope(ctx, y, B, T, H, Dh, 10000.0, true);   // and the other order
  ops::rope(ctx, y, B, T, H, Dh, 10000.0, false);
  EXPECT_LT(max_rel_diff(y, x), 1e-15);
}

TEST_F(RopeTest, BackwardIsInverseByFiniteDifferences) {
  Tensor x = randn({B, T, H, Dh}, 3), r = randn({B, T, H, Dh}, 4), y = poisoned({B, T, H, Dh});
  Tensor dx = clone(r);   // dL/dx = R^T r = inverse rotation of r
  ops::rope(ctx, dx, B, T, H, Dh, 10000.0, true);
  const auto f = [&] {
    ops::cast(ctx, x, y);   // y = x
    ops::rope(ctx, y, B, T, H, Dh, 10000.0, false);
    return dot(y, r);
  };
  expect_gradcheck_ok(gradcheck(f, {{"x", &x, &dx}}));
}

TEST_F(RopeTest, Fp32AgreesWithFp64AtLongPositions) {
  const std::int64_t b = 1, t = 2048, h = 2, dh = 16;
  Tensor x = randn({b, t, h, dh}, 5), x32 = as(x, DType::f32);
  ops::rope(ctx, x, b, t, h, dh, 10000.0, false);
  ops::rope(ctx, x32, b, t, h, dh, 10000.0, false);
  EXPECT_LT(max_rel_diff(x32, x), 1e-6);
}

// Issue 14: position 32767 = 2^15 - 1 (the last of a 32k context) on every frequency pair of a
// 128-wide head against a direct long-double rotation. The angle reaches 32767 rad; computed in
// fp32 it would be off by up to 2e-3 rad. Bounds, relative to the pair's norm: fp64 1e-10 (the
// double angle's rounding, 32767 * 2^-52 * a few), fp32 2e-6 (cos, sin and products in fp32).
TEST_F(RopeTest, Position32767MatchesLongDoubleOnEveryPair) {
  const std::int64_t b = 1, t = 32768, h = 1, dh = 128, half = dh / 2;
  Tensor x = randn({b, t, h, dh}, 8);
  Tensor x32 = as(x, DType::f32), x32_in = clone(x32);
  Tensor y = clone(x);
  ops::rope(ctx, y, b, t, h, dh, 10000.0, false);
  ops::rope(ctx, x32, b, t, h, dh, 10000.0, false);
  const auto xv = values(x), x32v = values(x32_in), yv = values(y), y32 = values(x32);
  for (std::int64_t pos : {t - 1, t - 2, std::int64_t{16384}}) {
    double worst64 = 0, worst32 = 0;
    for (std::int64_t i = 0; i < half; ++i) {
      const long double a = static_cast<long double>(pos) * std::pow(10000.0L, -2.0L * static_cast<long double>(i) / dh);
      const std::size_t e = static_cast<std::size_t>(pos * dh + 2 * i);
      auto err = [&](const std::vector<double>& in, const std::vector<double>& out) {
        const long double x0 = in[e], x1 = in[e + 1];
        const long double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x0 * std::sin(a) + x1 * std::cos(a);
        return std::hypot(out[e] - static_cast<double>(r0), out[e + 1] - static_cast<double>(r1)) /
               std::sqrt(static_cast<double>(x0 * x0 + x1 * x1));
      };
      worst64 = std::max(worst64, err(xv, yv));
      worst32 = std::max(worst32, err(x32v, y32));
    }
    EXPECT_LT(worst64, 1e-10) << "position " << pos;
    EXPECT_LT(worst32, 2e-6) << "position " << pos;
  }
}

TEST_F(RopeTest, BadArgumentsThrow) {
  Tensor x = randn({B, T, H, Dh}, 6);
  EXPECT_THROW(ops::rope(ctx, x, B, T, H, Dh + 1, 10000.0, false), Error);   // numel mismatch
  Tensor odd = randn({1, 2, 1, 3}, 7);
  EXPECT_THROW(ops::rope(ctx, odd, 1, 2, 1, 3, 10000.0, false), Error);   // odd head_dim
  EXPECT_THROW(ops::rope(ctx, x, B, T, H, Dh, 0.0, false), Error);       // theta must be > 0
  Tensor xb = as(x, DType::bf16);
  EXPECT_THROW(ops::rope(ctx, xb, B, T, H, Dh, 10000.0, false), Error);   // bf16 is CUDA-only
}

}  // namespace
}  // namespace lmscale::test
