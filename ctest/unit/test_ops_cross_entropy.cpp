// ops::cross_entropy on the CPU: loss against the naive formula, stability for huge logits,
// dlogits by central differences, in-place (dlogits over logits), fp32 vs fp64, bad arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using CrossEntropyTest = OpsTest;

// sum over rows of -log(softmax(x)[target]), straight from the definition.
double naive_loss(const Tensor& logits, const std::vector<std::int32_t>& targets) {
  const std::int64_t V = logits.dim(-1);
  const auto x = values(logits);
  double total = 0;
  for (std::size_t n = 0; n < targets.size(); ++n) {
    double z = 0;
    for (std::int64_t j = 0; j < V; ++j) z += std::exp(x[n * V + j]);
    total += -std::log(std::exp(x[n * V + targets[n]]) / z);
  }
  return total;
}

TEST_F(CrossEntropyTest, LossMatchesNaiveFormula) {
  const std::vector<std::int32_t> tv = {3, 0, 6, 3};
  Tensor logits = randn({4, 7}, 1, 3.0), tgt = ids({4}, tv), loss = poisoned({1});
  ops::cross_entropy(ctx, logits, tgt, loss, nullptr, 1.0);
  EXPECT_NEAR(loss.data_as<double>()[0], naive_loss(logits, tv), 1e-13);
}

TEST_F(CrossEntropyTest, HugeLogitsStayFinite) {
  const std::vector<std::int32_t> tv = {1, 2};
  Tensor logits = randn({2, 5}, 2), tgt = ids({2}, tv), loss = poisoned({1}), grad = poisoned({2, 5});
  Tensor shifted = clone(logits);
  for (std::int64_t i = 0; i < 10; ++i) shifted.data_as<double>()[i] += 1000.0;   // exp(1000) overflows
  ops::cross_entropy(ctx, shifted, tgt, loss, &grad, 1.0);
  // The loss is shift invariant: it equals the unshifted naive loss.
  EXPECT_NEAR(loss.data_as<double>()[0], naive_loss(logits, tv), 1e-12);
  for (double g : values(grad)) EXPECT_TRUE(std::isfinite(g));
}

TEST_F(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  const double grad_scale = 0.37;
  Tensor logits = randn({3, 2, 6}, 3, 2.0), tgt = ids({3, 2}, {0, 5, 2, 2, 4, 1});
  Tensor loss = poisoned({1}), dlogits = poisoned({3, 2, 6});
  ops::cross_entropy(ctx, logits, tgt, loss, &dlogits, grad_scale);
  const auto f = [&] {
    ops::cross_entropy(ctx, logits, tgt, loss, nullptr, 1.0);
    return grad_scale * loss.data_as<double>()[0];
  };
  expect_gradcheck_ok(gradcheck(f, {{"logits", &logits, &dlogits}}));
  // Each row of (softmax - onehot) sums to 0.
  const auto g = values(dlogits);
  for (int n = 0; n < 6; ++n) {
    double s = 0;
    for (int j = 0; j < 6; ++j) s += g[n * 6 + j];
    EXPECT_NEAR(s, 0.0, 1e-15);
  }
}

TEST_F(CrossEntropyTest, InPlaceMatchesOutOfPlace) {
  Tensor logits = randn({5, 9}, 4, 2.0), tgt = ids({5}, {8, 0, 3, 3, 7});
  Tensor loss_a = poisoned({1}), loss_b = poisoned({1}), dl = poisoned({5, 9});
  ops::cross_entropy(ctx, logits, tgt, loss_a, &dl, 0.125);
  Tensor inplace = clone(logits);
  ops::cross_entropy(ctx, inplace, tgt, loss_b, &inplace, 0.125);
  EXPECT_EQ(loss_a.data_as<double>()[0], loss_b.data_as<double>()[0]);
  EXPECT_EQ(values(inplace), values(dl));
}

TEST_F(CrossEntropyTest, Fp32AgreesWithFp64) {
  const std::int64_t N = 6, V = 50;
  std::vector<std::int32_t> tv;
  for (int n = 0; n < N; ++n) tv.push_back(static_cast<std::int32_t>((n * 17) % V));
  Tensor logits = randn({N, V}, 5, 3.0), tgt = ids({N}, tv), loss = poisoned({1}), dl = poisoned({N, V});
  ops::cross_entropy(ctx, logits, tgt, loss, &dl, 1.0 / N);
  Tensor l32 = as(logits, DType::f32), loss32 = poisoned({1}, DType::f32), dl32 = poisoned({N, V}, DType::f32);
  ops::cross_entropy(ctx, l32, tgt, loss32, &dl32, 1.0 / N);
  EXPECT_LT(max_rel_diff(loss32, loss), 1e-5);
  EXPECT_LT(max_rel_diff(dl32, dl), 1e-5);
}

TEST_F(CrossEntropyTest, BadArgumentsThrow) {
  Tensor logits = randn({2, 4}, 6), loss = poisoned({1});
  Tensor tgt_bad = ids({2}, {0, 4});
  EXPECT_THROW(ops::cross_entropy(ctx, logits, tgt_bad, loss, nullptr, 1.0), Error);   // target == V
  Tensor tgt_neg = ids({2}, {-1, 0});
  EXPECT_THROW(ops::cross_entropy(ctx, logits, tgt_neg, loss, nullptr, 1.0), Error);
  Tensor tgt3 = ids({3}, {0, 1, 2});
  EXPECT_THROW(ops::cross_entropy(ctx, logits, tgt3, loss, nullptr, 1.0), Error);     // count
  Tensor tgt = ids({2}, {0, 1}), loss32 = poisoned({1}, DType::f32);
  EXPECT_THROW(ops::cross_entropy(ctx, logits, tgt, loss32, nullptr, 1.0), Error);    // fp64 logits: fp64 loss
  Tensor dl_bad = poisoned({2, 5});
  EXPECT_THROW(ops::cross_entropy(ctx, logits, tgt, loss, &dl_bad, 1.0), Error);
  Tensor lb = as(logits, DType::bf16), lossf = poisoned({1}, DType::f32);
  EXPECT_THROW(ops::cross_entropy(ctx, lb, tgt, lossf, nullptr, 1.0), Error);         // bf16 is CUDA-only
}

}  // namespace
}  // namespace lmscale::test
