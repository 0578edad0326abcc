// ops::swiglu / swiglu_backward on the CPU: forward against the formula (also for large |a|),
// da and db by central differences, in-place outputs, fp32 vs fp64, bad arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using SwiGluTest = OpsTest;

TEST_F(SwiGluTest, ForwardMatchesFormula) {
  Tensor a = randn({3, 5}, 1, 2.0), b = randn({3, 5}, 2), h = poisoned({3, 5});
  a.data_as<double>()[0] = -800.0;   // exp(800) overflows: silu must go to 0, not NaN
  a.data_as<double>()[1] = 800.0;
  ops::swiglu(ctx, a, b, h);
  const auto av = values(a), bv = values(b), hv = values(h);
  for (std::size_t i = 0; i < av.size(); ++i) {
    const double want = av[i] / (1.0 + std::exp(-av[i])) * bv[i];
    EXPECT_NEAR(hv[i], want, 1e-14 * std::max(1.0, std::fabs(want))) << i;
  }
  EXPECT_EQ(hv[0], 0.0);
}

TEST_F(SwiGluTest, BackwardMatchesFiniteDifferences) {
  Tensor a = randn({4, 6}, 3, 2.0), b = randn({4, 6}, 4), r = randn({4, 6}, 5), h = poisoned({4, 6});
  Tensor da = poisoned({4, 6}), db = poisoned({4, 6});
  ops::swiglu_backward(ctx, a, b, r, da, db);
  const auto f = [&] {
    ops::swiglu(ctx, a, b, h);
    return dot(h, r);
  };
  expect_gradcheck_ok(gradcheck(f, {{"a", &a, &da}, {"b", &b, &db}}));
}

TEST_F(SwiGluTest, BackwardInPlaceMatchesOutOfPlace) {
  Tensor a = randn({2, 7}, 6, 2.0), b = randn({2, 7}, 7), dh = randn({2, 7}, 8);
  Tensor da = poisoned({2, 7}), db = poisoned({2, 7});
  ops::swiglu_backward(ctx, a, b, dh, da, db);
  Tensor a2 = clone(a), b2 = clone(b);
  ops::swiglu_backward(ctx, a2, b2, dh, a2, b2);   // da over a, db over b
  EXPECT_EQ(values(a2), values(da));
  EXPECT_EQ(values(b2), values(db));
}

TEST_F(SwiGluTest, Fp32AgreesWithFp64) {
  Tensor a = randn({8, 16}, 9, 2.0), b = randn({8, 16}, 10), dh = randn({8, 16}, 11);
  Tensor h = poisoned({8, 16}), da = poisoned({8, 16}), db = poisoned({8, 16});
  ops::swiglu(ctx, a, b, h);
  ops::swiglu_backward(ctx, a, b, dh, da, db);
  Tensor a32 = as(a, DType::f32), b32 = as(b, DType::f32), dh32 = as(dh, DType::f32);
  Tensor h32 = poisoned({8, 16}, DType::f32), da32 = poisoned({8, 16}, DType::f32), db32 = poisoned({8, 16}, DType::f32);
  ops::swiglu(ctx, a32, b32, h32);
  ops::swiglu_backward(ctx, a32, b32, dh32, da32, db32);
  EXPECT_LT(max_rel_diff(h32, h), 1e-5);
  EXPECT_LT(max_rel_diff(da32, da), 1e-5);
  EXPECT_LT(max_rel_diff(db32, db), 1e-5);
}

TEST_F(SwiGluTest, BadArgumentsThrow) {
  Tensor a = randn({2, 3}, 12), b = randn({3, 2}, 13), h = poisoned({2, 3});
  EXPECT_THROW(ops::swiglu(ctx, a, b, h), Error);   // b shape
  Tensor b_ok = randn({2, 3}, 14), h32 = poisoned({2, 3}, DType::f32);
  EXPECT_THROW(ops::swiglu(ctx, a, b_ok, h32), Error);   // dtype mismatch
  Tensor dh = randn({2, 3}, 15), da = poisoned({2, 3}), db_bad = poisoned({6});
  EXPECT_THROW(ops::swiglu_backward(ctx, a, b_ok, dh, da, db_bad), Error);
  Tensor i32 = ids({2, 3}, {0, 0, 0, 0, 0, 0}), hi = ids({2, 3}, {0, 0, 0, 0, 0, 0});
  EXPECT_THROW(ops::swiglu(ctx, i32, i32, hi), Error);   // not floating
}

}  // namespace
}  // namespace lmscale::test
