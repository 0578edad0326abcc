// ops::linear_cross_entropy (the fused LM head + cross-entropy) on the CPU: gradients of y and w
// by central differences in float64 for several chunk sizes (one row, a remainder chunk, one
// chunk), one chunk bitwise equal to linear + cross_entropy + linear_backward, every chunking equal
// to it up to rounding in fp32, accumulation into dw, the logits buffer bounded by the chunk, and
// bad arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using LinearCrossEntropyTest = OpsTest;

constexpr std::int64_t N = 7, d = 5, V = 11;

std::vector<std::int32_t> targets_of(std::int64_t n, std::int64_t v) {
  std::vector<std::int32_t> t;
  for (std::int64_t i = 0; i < n; ++i) t.push_back(static_cast<std::int32_t>((i * 7 + 3) % v));
  return t;
}

// The unfused reference: all logits, cross_entropy in place, linear_backward.
struct Unfused {
  Tensor loss, dy, dw;
};

TEST_F(LinearCrossEntropyTest, GradientsMatchFiniteDifferencesForEveryChunking) {
  const double grad_scale = 0.3;
  for (std::int64_t chunk : {std::int64_t{1}, std::int64_t{3}, std::int64_t{4}, N, std::int64_t{100}}) {
    SCOPED_TRACE(::testing::Message() << "chunk_rows " << chunk);
    Tensor y = randn({N, d}, 1, 1.5), w = randn({V, d}, 2, 0.8), tgt = ids({N}, targets_of(N, V));
    Tensor loss = poisoned({1}), dy = poisoned({N, d}), dw = poisoned({V, d});
    ops::linear_cross_entropy(ctx, y, w, tgt, loss, &dy, &dw, false, grad_scale, chunk);
    const auto f = [&] {
      Tensor l = poisoned({1});
      ops::linear_cross_entropy(ctx, y, w, tgt, l, nullptr, nullptr, false, 1.0, chunk);
      return grad_scale * l.data_as<double>()[0];
    };
    expect_gradcheck_ok(gradcheck(f, {{"y", &y, &dy}, {"w", &w, &dw}}));
    // The loss itself: the sum over rows of -log softmax(y w^T)[target].
    double ref = 0;
    const auto yv = values(y), wv = values(w);
    const auto tv = targets_of(N, V);
    for (std::int64_t n = 0; n < N; ++n) {
      std::vector<double> z(V);
      double m = -INFINITY;
      for (std::int64_t v = 0; v < V; ++v) {
        for (std::int64_t k = 0; k < d; ++k) z[v] += yv[n * d + k] * wv[v * d + k];
        m = std::max(m, z[v]);
      }
      double s = 0;
      for (double x : z) s += std::exp(x - m);
      ref += m + std::log(s) - z[tv[n]];
    }
    EXPECT_NEAR(loss.data_as<double>()[0], ref, 1e-12 * std::fabs(ref));
  }
}

TEST_F(LinearCrossEntropyTest, OneChunkIsBitwiseTheUnfusedOps) {
  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor y = randn({N, d}, 3, 1.0, 0.0, t), w = randn({V, d}, 4, 1.0, 0.0, t), tgt = ids({N}, targets_of(N, V));
    Tensor loss = poisoned({1}, t), dy = poisoned({N, d}, t), dw = poisoned({V, d}, t);
    ops::linear_cross_entropy(ctx, y, w, tgt, loss, &dy, &dw, false, 0.25, N);
    Tensor logits = poisoned({N, V}, t), loss_u = poisoned({1}, t), dy_u = poisoned({N, d}, t), dw_u = poisoned({V, d}, t);
    ops::linear(ctx, y, w, logits);
    ops::cross_entropy(ctx, logits, tgt, loss_u, &logits, 0.25);
    ops::linear_backward(ctx, y, w, logits, &dy_u, &dw_u, false);
    EXPECT_EQ(values(loss), values(loss_u));
    EXPECT_EQ(values(dy), values(dy_u));
    EXPECT_EQ(values(dw), values(dw_u));
  }
}

TEST_F(LinearCrossEntropyTest, ChunkedEqualsUnchunkedUpToRoundingInFp32) {
  const std::int64_t n = 50, dd = 16, v = 37;
  Tensor y = randn({n, dd}, 5, 1.0, 0.0, DType::f32), w = randn({v, dd}, 6, 0.5, 0.0, DType::f32);
  Tensor tgt = ids({n}, targets_of(n, v));
  Tensor loss1 = poisoned({1}, DType::f32), dy1 = poisoned({n, dd}, DType::f32), dw1 = poisoned({v, dd}, DType::f32);
  ops::linear_cross_entropy(ctx, y, w, tgt, loss1, &dy1, &dw1, false, 1.0 / n, n);
  for (std::int64_t chunk : {std::int64_t{1}, std::int64_t{7}, std::int64_t{16}, std::int64_t{49}}) {
    SCOPED_TRACE(::testing::Message() << "chunk_rows " << chunk);
    Tensor loss = poisoned({1}, DType::f32), dy = poisoned({n, dd}, DType::f32), dw = poisoned({v, dd}, DType::f32);
    ops::linear_cross_entropy(ctx, y, w, tgt, loss, &dy, &dw, false, 1.0 / n, chunk);
    EXPECT_NEAR(loss.data_as<float>()[0], loss1.data_as<float>()[0], 2e-6 * std::fabs(loss1.data_as<float>()[0]));
    EXPECT_LT(max_rel_diff(dy, dy1), 1e-6);
    EXPECT_LT(max_rel_diff(dw, dw1), 1e-6);
  }
}

TEST_F(LinearCrossEntropyTest, AccumulatesIntoDwAndOverwritesDy) {
  Tensor y = randn({N, d}, 7), w = randn({V, d}, 8), tgt = ids({N}, targets_of(N, V));
  Tensor loss = poisoned({1}), dy = poisoned({N, d}), dw = poisoned({V, d});
  ops::linear_cross_entropy(ctx, y, w, tgt, loss, &dy, &dw, false, 1.0, 3);
  const auto once = values(dw), dy_once = values(dy);
  ops::fill(ctx, dy, 123.0);
  ops::linear_cross_entropy(ctx, y, w, tgt, loss, &dy, &dw, true, 1.0, 3);
  const auto twice = values(dw);
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-14 * (1 + std::fabs(once[i])));
  EXPECT_EQ(values(dy), dy_once);
  // Only dw, or only dy.
  Tensor dw2 = poisoned({V, d});
  ops::linear_cross_entropy(ctx, y, w, tgt, loss, nullptr, &dw2, false, 1.0, 3);
  EXPECT_EQ(values(dw2), once);
}

TEST_F(LinearCrossEntropyTest, LogitsBufferHoldsOneChunk) {
  const std::int64_t n = 64, v = 1000;
  Tensor y = randn({n, d}, 9), w = randn({v, d}, 10), tgt = ids({n}, targets_of(n, v));
  Tensor loss = poisoned({1}), dy = poisoned({n, d}), dw = poisoned({v, d});
  for (std::int64_t chunk : {std::int64_t{5}, n}) {
    alloc.tracker().mark_phase("before");
    const std::size_t base = alloc.tracker().current();
    ops::linear_cross_entropy(ctx, y, w, tgt, loss, &dy, &dw, false, 1.0, chunk);
    alloc.tracker().mark_phase("op");
    const std::size_t extra = alloc.tracker().phase_peaks().at("op") - base;
    // chunk x V doubles, plus the per-chunk loss scalar when there are several chunks
    EXPECT_EQ(extra, static_cast<std::size_t>(chunk * v * 8 + (chunk < n ? 8 : 0))) << chunk;
  }
}

TEST_F(LinearCrossEntropyTest, BadArgumentsThrow) {
  Tensor y = randn({N, d}, 11), w = randn({V, d}, 12), tgt = ids({N}, targets_of(N, V)), loss = poisoned({1});
  EXPECT_THROW(ops::linear_cross_entropy(ctx, y, w, tgt, loss, nullptr, nullptr, false, 1.0, 0), Error);
  Tensor w_bad = randn({V, d + 1}, 13);
  EXPECT_THROW(ops::linear_cross_entropy(ctx, y, w_bad, tgt, loss, nullptr, nullptr, false, 1.0, 2), Error);
  Tensor tgt_short = ids({N - 1}, targets_of(N - 1, V));
  EXPECT_THROW(ops::linear_cross_entropy(ctx, y, w, tgt_short, loss, nullptr, nullptr, false, 1.0, 2), Error);
  Tensor dy_bad = poisoned({N, d + 1});
  EXPECT_THROW(ops::linear_cross_entropy(ctx, y, w, tgt, loss, &dy_bad, nullptr, false, 1.0, 2), Error);
  Tensor tgt_out = ids({N}, std::vector<std::int32_t>(N, static_cast<std::int32_t>(V)));
  EXPECT_THROW(ops::linear_cross_entropy(ctx, y, w, tgt_out, loss, nullptr, nullptr, false, 1.0, 2), Error);
}

}  // namespace
}  // namespace lmscale::test
