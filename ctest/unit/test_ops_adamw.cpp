// ops::adamw on the CPU against hand-worked steps t = 1 and t = 2 (docs/architecture.md §2 order: decoupled
// decay first), fp32 vs fp64, the low-precision copy, and bad arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "ops_test_util.h"

namespace lmscale::test {
namespace {

class AdamWTest : public OpsTest {
 protected:
  Tensor from(const std::vector<double>& v) {
    Tensor x = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::f64, alloc, "test");
    std::copy(v.begin(), v.end(), x.data_as<double>());
    return x;
  }
};

// lr 0.01, wd 0.1, b1 0.9, b2 0.999, eps 1e-8, grad_scale 0.5.
ops::AdamWStep hyper(std::int64_t t) {
  ops::AdamWStep a;
  a.lr = 0.01;
  a.weight_decay = 0.1;
  a.beta1 = 0.9;
  a.beta2 = 0.999;
  a.eps = 1e-8;
  a.grad_scale = 0.5;
  a.step = t;
  return a;
}

const std::vector<double> kP0 = {0.5, -1.0, 2.0};
const std::vector<double> kGrad1 = {0.1, -0.2, 0.0};   // the third element sees no gradient at t = 1
const std::vector<double> kGrad2 = {0.3, 0.1, -0.4};

TEST_F(AdamWTest, HandWorkedStepsOneAndTwo) {
  Tensor p = from(kP0), m = zeros({3}), v = zeros({3});
  Tensor g1 = from(kGrad1), g2 = from(kGrad2);

  // t = 1. Decay: p <- (1 - 0.01*0.1) p = 0.999 p. g = 0.5 grad. m = 0.1 g, v = 0.001 g^2.
  // step size = 0.01 * sqrt(1 - 0.999) / (1 - 0.9) = 0.1 sqrt(0.001) and m = 0.1 g, so the update is
  //   0.1 sqrt(0.001) * 0.1 g / (sqrt(v) + eps) = 0.01 sign(g) * sqrt(v) / (sqrt(v) + eps)
  // with sqrt(v) = sqrt(0.001) |g|: element 0 has g = 0.05, element 1 g = -0.1.
  ops::adamw(ctx, p, g1, m, v, hyper(1), nullptr);
  const double s0 = 0.05 * std::sqrt(0.001), s1 = 0.1 * std::sqrt(0.001);
  const double want_p1[3] = {0.999 * 0.5 - 0.01 * s0 / (s0 + 1e-8), 0.999 * -1.0 + 0.01 * s1 / (s1 + 1e-8),
                             0.999 * 2.0};   // zero gradient: m = v = 0, the update is 0 / eps = 0
  const double want_m1[3] = {0.1 * 0.05, 0.1 * -0.1, 0.0}, want_v1[3] = {0.001 * 0.0025, 0.001 * 0.01, 0.0};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(p.data_as<double>()[i], want_p1[i], 1e-15) << i;
    EXPECT_NEAR(m.data_as<double>()[i], want_m1[i], 1e-14 * std::fabs(want_m1[i])) << i;
    EXPECT_NEAR(v.data_as<double>()[i], want_v1[i], 1e-14 * std::fabs(want_v1[i])) << i;
  }
  // The same numbers to 17 digits (worked out separately in Python with the formula).
  EXPECT_NEAR(p.data_as<double>()[0], 0.48950006324515322, 1e-16);
  EXPECT_NEAR(p.data_as<double>()[1], -0.98900003162267658, 1e-16);

  // t = 2: m = 0.9 m1 + 0.1 g, v = 0.999 v1 + 0.001 g^2, step size 0.01 sqrt(1 - 0.999^2) / (1 - 0.9^2).
  ops::adamw(ctx, p, g2, m, v, hyper(2), nullptr);
  const double step2 = 0.01 * std::sqrt(1.0 - 0.999 * 0.999) / (1.0 - 0.81);
  for (int i = 0; i < 3; ++i) {
    const double g = 0.5 * kGrad2[i];
    const double mi = 0.9 * want_m1[i] + 0.1 * g, vi = 0.999 * want_v1[i] + 0.001 * g * g;
    const double pi = 0.999 * want_p1[i] - step2 * mi / (std::sqrt(vi) + 1e-8);
    EXPECT_NEAR(m.data_as<double>()[i], mi, 1e-14 * std::fabs(mi)) << i;
    EXPECT_NEAR(v.data_as<double>()[i], vi, 1e-14 * std::fabs(vi)) << i;
    EXPECT_NEAR(p.data_as<double>()[i], pi, 1e-15) << i;
  }
  EXPECT_NEAR(p.data_as<double>()[0], 0.47983277034860861, 1e-15);
  EXPECT_NEAR(p.data_as<double>()[1], -0.98534766873059265, 1e-15);
  EXPECT_NEAR(p.data_as<double>()[2], 2.0034433564698522, 1e-15);
  // Decay after the Adam update instead would put element 2 at 0.999 * (0.999 * 2 - u) rather than
  // 0.999 * 0.999 * 2 - u, a difference of 1e-3 u ~ 1e-5: far outside the tolerances above.
}

TEST_F(AdamWTest, Fp32AgreesWithFp64AndWritesLowPrecisionCopy) {
  const std::int64_t n = 257;
  Tensor p = randn({n}, 1), g = randn({n}, 2, 0.1), m = zeros({n}), v = zeros({n});
  Tensor p32 = as(p, DType::f32), g32 = as(g, DType::f32), m32 = zeros({n}, DType::f32), v32 = zeros({n}, DType::f32);
  Tensor lowb = Tensor::empty({n}, DType::bf16, alloc, "test"), lowh = Tensor::empty({n}, DType::f16, alloc, "test");
  for (std::int64_t t = 1; t <= 3; ++t) {
    ops::adamw(ctx, p, g, m, v, hyper(t), nullptr);
    ops::adamw(ctx, p32, g32, m32, v32, hyper(t), t % 2 ? &lowb : &lowh);
  }
  EXPECT_LT(max_rel_diff(p32, p), 1e-6);
  EXPECT_LT(max_rel_diff(m32, m), 1e-5);
  EXPECT_LT(max_rel_diff(v32, v), 1e-5);
  // Step 3 wrote the bf16 copy, step 2 the fp16 copy: the bf16 one is the rounded final fp32 value.
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(lowb.data_as<std::uint16_t>()[i], float_to_bf16(p32.data_as<float>()[i]).bits) << i;
  }
  Tensor q = clone(p32), gq = clone(g32), mq = clone(m32), vq = clone(v32);
  ops::adamw(ctx, q, gq, mq, vq, hyper(4), &lowh);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(lowh.data_as<std::uint16_t>()[i], float_to_f16(q.data_as<float>()[i]).bits);
  // fp64 master with an fp32 copy: one rounding of the fp64 value.
  Tensor low32 = poisoned({n}, DType::f32);
  ops::adamw(ctx, p, g, m, v, hyper(4), &low32);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(low32.data_as<float>()[i], static_cast<float>(p.data_as<double>()[i]));
}

TEST_F(AdamWTest, BadArgumentsThrow) {
  Tensor p = randn({4}, 3), g = randn({4}, 4), m = zeros({4}), v = zeros({4});
  EXPECT_THROW(ops::adamw(ctx, p, g, m, v, hyper(0), nullptr), Error);   // t is 1-based
  Tensor g_bad = randn({5}, 5);
  EXPECT_THROW(ops::adamw(ctx, p, g_bad, m, v, hyper(1), nullptr), Error);
  Tensor m32 = zeros({4}, DType::f32);
  EXPECT_THROW(ops::adamw(ctx, p, g, m32, v, hyper(1), nullptr), Error);
  Tensor low_bad = poisoned({3}, DType::bf16);
  EXPECT_THROW(ops::adamw(ctx, p, g, m, v, hyper(1), &low_bad), Error);
  auto bad = hyper(1);
  bad.beta2 = 1.0;
  EXPECT_THROW(ops::adamw(ctx, p, g, m, v, bad, nullptr), Error);
  Tensor pb = as(p, DType::bf16), gb = as(g, DType::bf16), mb = zeros({4}, DType::bf16), vb = zeros({4}, DType::bf16);
  EXPECT_THROW(ops::adamw(ctx, pb, gb, mb, vb, hyper(1), nullptr), Error);   // bf16 master state: no
}

// adamw_pieces (gradients in separate tensors) is adamw over each piece; pieces must be sorted,
// without gaps, and cover the parameters.
TEST_F(AdamWTest, PiecesEqualAdamWPerPieceAndMustCoverTheRange) {
  const std::int64_t n = 37;
  Tensor p = randn({n}, 5), g = randn({n}, 6, 0.1), m = zeros({n}), v = zeros({n});
  Tensor p2 = randn({n}, 5), m2 = zeros({n}), v2 = zeros({n});
  const std::vector<std::int64_t> cut = {0, 8, 8, 21, 37};   // an empty piece at 8
  std::vector<ops::GradPiece> pieces;
  for (std::size_t i = 0; i + 1 < cut.size(); ++i) {
    const std::int64_t k = cut[i + 1] - cut[i];
    Tensor gi = zeros({k});
    std::copy(g.data_as<double>() + cut[i], g.data_as<double>() + cut[i + 1], gi.data_as<double>());
    pieces.push_back({cut[i], gi});
  }
  for (std::int64_t t : {1, 2}) {
    ops::adamw_pieces(ctx, p, pieces, m, v, hyper(t), nullptr);
    ops::adamw(ctx, p2, g, m2, v2, hyper(t), nullptr);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(p.data_as<double>()[i], p2.data_as<double>()[i]) << i;
    EXPECT_EQ(m.data_as<double>()[i], m2.data_as<double>()[i]) << i;
    EXPECT_EQ(v.data_as<double>()[i], v2.data_as<double>()[i]) << i;
  }
  std::vector<ops::GradPiece> gap = {pieces[0], pieces[3]};
  EXPECT_THROW(ops::adamw_pieces(ctx, p, gap, m, v, hyper(3), nullptr), Error);
  std::vector<ops::GradPiece> unsorted = {pieces[3], pieces[0], pieces[1], pieces[2]};
  EXPECT_THROW(ops::adamw_pieces(ctx, p, unsorted, m, v, hyper(3), nullptr), Error);
  std::vector<ops::GradPiece> short_of = {pieces[0], pieces[1], pieces[2]};
  EXPECT_THROW(ops::adamw_pieces(ctx, p, short_of, m, v, hyper(3), nullptr), Error);
  EXPECT_THROW(ops::adamw_pieces(ctx, p, pieces, m, v, hyper(0), nullptr), Error);
}

}  // namespace
}  // namespace lmscale::test
