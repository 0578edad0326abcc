// ops::linear / linear_backward on the CPU: forward against a naive triple loop, backward by
// central differences in fp64, the accumulate flag, optional outputs, fp32 vs fp64, bad shapes.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using LinearTest = OpsTest;

// y[m,n] = sum_k x[m,k] w[n,k]
std::vector<double> naive_linear(const Tensor& x, const Tensor& w) {
  const std::int64_t N = w.dim(0), K = w.dim(1), M = x.numel() / K;
  const auto xv = values(x), wv = values(w);
  std::vector<double> y(static_cast<std::size_t>(M * N), 0.0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k) y[m * N + n] += xv[m * K + k] * wv[n * K + k];
  return y;
}

TEST_F(LinearTest, ForwardMatchesNaive) {
  Tensor x = randn({2, 3, 5}, 1), w = randn({4, 5}, 2), y = poisoned({2, 3, 4});
  ops::linear(ctx, x, w, y);
  const auto ref = naive_linear(x, w), got = values(y);
  ASSERT_EQ(ref.size(), got.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-13) << i;
}

TEST_F(LinearTest, BackwardMatchesFiniteDifferences) {
  Tensor x = randn({5, 4}, 3), w = randn({3, 4}, 4), r = randn({5, 3}, 5);
  Tensor y = poisoned({5, 3}), dx = poisoned({5, 4}), dw = poisoned({3, 4});
  ops::linear_backward(ctx, x, w, r, &dx, &dw, false);   // dy = r for f = <y, r>
  const auto f = [&] {
    ops::linear(ctx, x, w, y);
    return dot(y, r);
  };
  expect_gradcheck_ok(gradcheck(f, {{"x", &x, &dx}, {"w", &w, &dw}}));
}

TEST_F(LinearTest, AccumulateAddsAndOverwriteReplaces) {
  Tensor x = randn({6, 4}, 6), w = randn({3, 4}, 7), dy = randn({6, 3}, 8);
  Tensor dw_fresh = poisoned({3, 4});
  ops::linear_backward(ctx, x, w, dy, nullptr, &dw_fresh, false);
  Tensor dw0 = randn({3, 4}, 9), dw_acc = clone(dw0);
  ops::linear_backward(ctx, x, w, dy, nullptr, &dw_acc, true);
  const auto fresh = values(dw_fresh), acc = values(dw_acc), base = values(dw0);
  for (std::size_t i = 0; i < fresh.size(); ++i) EXPECT_NEAR(acc[i], base[i] + fresh[i], 1e-13) << i;
  // Overwrite ignores what was there.
  Tensor dw_over = clone(dw0);
  ops::linear_backward(ctx, x, w, dy, nullptr, &dw_over, false);
  EXPECT_EQ(values(dw_over), fresh);
}

TEST_F(LinearTest, OptionalOutputsAreSkipped) {
  Tensor x = randn({2, 4}, 10), w = randn({3, 4}, 11), dy = randn({2, 3}, 12);
  Tensor dx = poisoned({2, 4}), dw = full({3, 4}, 7.0);
  ops::linear_backward(ctx, x, w, dy, &dx, nullptr, false);   // dw untouched
  for (double v : values(dx)) EXPECT_FALSE(std::isnan(v));
  for (double v : values(dw)) EXPECT_EQ(v, 7.0);
  Tensor dx2 = full({2, 4}, 7.0), dw2 = poisoned({3, 4});
  ops::linear_backward(ctx, x, w, dy, nullptr, &dw2, false);   // dx untouched
  for (double v : values(dx2)) EXPECT_EQ(v, 7.0);
  for (double v : values(dw2)) EXPECT_FALSE(std::isnan(v));
  EXPECT_NO_THROW(ops::linear_backward(ctx, x, w, dy, nullptr, nullptr, false));
}

TEST_F(LinearTest, EmptyInnerDimensionGivesZeros) {
  Tensor x = zeros({3, 0}), w = zeros({2, 0}), y = poisoned({3, 2});
  ops::linear(ctx, x, w, y);
  for (double v : values(y)) EXPECT_EQ(v, 0.0);
}

TEST_F(LinearTest, Fp32AgreesWithFp64) {
  Tensor x = randn({7, 16}, 13), w = randn({9, 16}, 14), y = poisoned({7, 9});
  Tensor x32 = as(x, DType::f32), w32 = as(w, DType::f32), y32 = poisoned({7, 9}, DType::f32);
  ops::linear(ctx, x, w, y);
  ops::linear(ctx, x32, w32, y32);
  EXPECT_LT(max_rel_diff(y32, y), 1e-5);
  Tensor dy = randn({7, 9}, 15), dx = poisoned({7, 16}), dw = poisoned({9, 16});
  Tensor dy32 = as(dy, DType::f32), dx32 = poisoned({7, 16}, DType::f32), dw32 = poisoned({9, 16}, DType::f32);
  ops::linear_backward(ctx, x, w, dy, &dx, &dw, false);
  ops::linear_backward(ctx, x32, w32, dy32, &dx32, &dw32, false);
  EXPECT_LT(max_rel_diff(dx32, dx), 1e-5);
  EXPECT_LT(max_rel_diff(dw32, dw), 1e-5);
}

TEST_F(LinearTest, BadArgumentsThrow) {
  Tensor x = randn({2, 4}, 16), w = randn({3, 4}, 17);
  Tensor y_bad = poisoned({2, 4});
  EXPECT_THROW(ops::linear(ctx, x, w, y_bad), Error);   // y must be [2, 3]
  Tensor w_bad = randn({3, 5}, 18), y = poisoned({2, 3});
  EXPECT_THROW(ops::linear(ctx, x, w_bad, y), Error);   // K mismatch
  Tensor w1d = randn({12}, 19);
  EXPECT_THROW(ops::linear(ctx, x, w1d, y), Error);     // weight not 2-D
  Tensor y32 = poisoned({2, 3}, DType::f32);
  EXPECT_THROW(ops::linear(ctx, x, w, y32), Error);     // dtype mismatch
  Tensor xb = as(x, DType::bf16), wb = as(w, DType::bf16), yb = poisoned({2, 3}, DType::bf16);
  EXPECT_THROW(ops::linear(ctx, xb, wb, yb), Error);    // bf16 is CUDA-only
  Tensor dy = randn({2, 3}, 20), dw_bad = poisoned({4, 3});
  EXPECT_THROW(ops::linear_backward(ctx, x, w, dy, nullptr, &dw_bad, false), Error);
  Tensor dx_bad = poisoned({2, 3});
  EXPECT_THROW(ops::linear_backward(ctx, x, w, dy, &dx_bad, nullptr, false), Error);
}

// linear_group is the products of linear, one per weight; its backward sums the input gradients
// (checked by finite differences of f = sum_i <y_i, r_i>) and gives each weight its own gradient.
TEST_F(LinearTest, GroupIsOneLinearPerWeightAndSumsTheInputGradients) {
  Tensor x = randn({5, 4}, 30);
  const std::vector<Tensor> ws = {randn({3, 4}, 31), randn({3, 4}, 32), randn({3, 4}, 33)};
  const std::vector<Tensor> rs = {randn({5, 3}, 34), randn({5, 3}, 35), randn({5, 3}, 36)};
  std::vector<Tensor> ys = {poisoned({5, 3}), poisoned({5, 3}), poisoned({5, 3})};
  ops::linear_group(ctx, x, ws, ys);
  for (std::size_t i = 0; i < ws.size(); ++i) {
    Tensor yi = poisoned({5, 3});
    ops::linear(ctx, x, ws[i], yi);
    EXPECT_EQ(values(ys[i]), values(yi)) << i;
  }
  Tensor dx = poisoned({5, 4});
  const std::vector<Tensor> dws = {poisoned({3, 4}), poisoned({3, 4}), poisoned({3, 4})};
  ops::linear_group_backward(ctx, x, ws, rs, &dx, &dws, false);
  std::vector<Tensor> wv = ws;   // gradcheck perturbs these in place
  const auto f = [&] {
    ops::linear_group(ctx, x, wv, ys);
    double sum = 0;
    for (std::size_t i = 0; i < ys.size(); ++i) sum += dot(ys[i], rs[i]);
    return sum;
  };
  Tensor dw0 = dws[0], dw1 = dws[1], dw2 = dws[2];
  expect_gradcheck_ok(gradcheck(f, {{"x", &x, &dx}, {"w0", &wv[0], &dw0}, {"w1", &wv[1], &dw1}, {"w2", &wv[2], &dw2}}));
  // accumulate adds to what the weight gradients held; dx alone leaves them untouched
  const std::vector<Tensor> acc = {clone(dws[0]), clone(dws[1]), clone(dws[2])};
  ops::linear_group_backward(ctx, x, ws, rs, nullptr, &acc, true);
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const auto a = values(acc[i]), once = values(dws[i]);
    for (std::size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], 2 * once[j], 1e-13);
  }
  std::vector<Tensor> bad = {poisoned({5, 3})};
  EXPECT_THROW(ops::linear_group(ctx, x, ws, bad), Error);   // one output for three weights
}

// linear_group's strided batch (ops/cuda/linear.cpp) spans any spacing only between views of one
// allocation: views of one tensor share it, separate tensors and non-owning views do not.
TEST_F(LinearTest, SameStorageHoldsForViewsOfOneAllocationOnly) {
  Tensor w = randn({8, 3, 4}, 6), other = randn({8, 3, 4}, 7);
  const Tensor w0 = w.slice(0, 1).reshape({3, 4}), w7 = w.slice(7, 8).reshape({3, 4});
  EXPECT_TRUE(w0.same_storage(w7));
  EXPECT_TRUE(w.flat_range(12, 12).same_storage(w));
  EXPECT_FALSE(w0.same_storage(other.slice(0, 1)));
  const Tensor borrowed = Tensor::view(w.data(), w.shape(), w.dtype(), w.device());
  EXPECT_FALSE(borrowed.same_storage(w));
  EXPECT_FALSE(borrowed.same_storage(borrowed));
}

}  // namespace
}  // namespace lmscale::test
