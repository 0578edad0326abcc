// ops::moe_* on the CPU (docs/moe.md): the router's softmax, top-k and renormalised gates, the
// written tie-break (lower expert index first), the dispatch plan with per-sequence capacity
// (earlier tokens win), the permutation and combine with their backwards by central differences,
// the router losses and the router's backward by central differences, fp32 against fp64.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "lmscale/ops/moe.h"
#include "lmscale/ops/moe_experts.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using MoeOpsTest = OpsTest;

std::vector<std::int32_t> ints(const Tensor& t) {
  const auto* p = t.data_as<std::int32_t>();
  return std::vector<std::int32_t>(p, p + t.numel());
}

TEST_F(MoeOpsTest, RouteIsSoftmaxTopKWithRenormalisedGates) {
  const std::int64_t N = 5, E = 6, k = 2;
  Tensor z = randn({N, E}, 1, 2.0), p = poisoned({N, E}), lse = poisoned({N}), g = poisoned({N, k});
  Tensor ex = ids({N, k}, std::vector<std::int32_t>(N * k, -7));
  ops::moe_route(ctx, z, p, lse, ex, g);
  const auto zv = values(z), pv = values(p), lv = values(lse), gv = values(g);
  const auto ev = ints(ex);
  for (std::int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (std::int64_t e = 0; e < E; ++e) s += std::exp(zv[n * E + e]);
    EXPECT_NEAR(lv[n], std::log(s), 1e-13);
    for (std::int64_t e = 0; e < E; ++e) EXPECT_NEAR(pv[n * E + e], std::exp(zv[n * E + e]) / s, 1e-15);
    // The chosen experts hold the two largest probabilities, in decreasing order.
    const std::int32_t e0 = ev[n * k], e1 = ev[n * k + 1];
    EXPECT_NE(e0, e1);
    EXPECT_GE(pv[n * E + e0], pv[n * E + e1]);
    for (std::int64_t e = 0; e < E; ++e) {
      if (e != e0 && e != e1) {
        EXPECT_LE(pv[n * E + e], pv[n * E + e1]);
      }
    }
    const double S = pv[n * E + e0] + pv[n * E + e1];
    EXPECT_NEAR(gv[n * k], pv[n * E + e0] / S, 1e-15);
    EXPECT_NEAR(gv[n * k + 1], pv[n * E + e1] / S, 1e-15);
  }
}

TEST_F(MoeOpsTest, TiesGoToTheLowerExpertIndex) {
  // Row 0: all equal -> experts 0, 1. Row 1: experts 3 and 5 tie for first -> 3, then 5.
  // Row 2: expert 4 first, 1 and 2 tie for second -> 1.
  Tensor z = Tensor::empty({3, 6}, DType::f64, alloc, "test");
  const double v[18] = {0, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 2, 0, 1, 1, 0, 3, 0};
  std::copy(v, v + 18, z.data_as<double>());
  for (DType t : {DType::f64, DType::f32}) {
    Tensor zt = as(z, t), p = poisoned({3, 6}, t), lse = poisoned({3}, t), g = poisoned({3, 2}, t);
    Tensor ex = ids({3, 2}, std::vector<std::int32_t>(6, -1));
    ops::moe_route(ctx, zt, p, lse, ex, g);
    EXPECT_EQ(ints(ex), (std::vector<std::int32_t>{0, 1, 3, 5, 4, 1})) << dtype_name(t);
    EXPECT_EQ(values(g)[0], 0.5);
    EXPECT_EQ(values(g)[2], 0.5);
  }
}

TEST_F(MoeOpsTest, PlanKeepsEarlierTokensOfEachSequenceUpToTheCapacity) {
  // Two sequences (groups) of 3 tokens, k = 2, E = 3, capacity 2 per expert per sequence.
  // Sequence 0: tokens choose (0,1), (0,2), (0,1): expert 0 takes tokens 0 and 1, token 2's is dropped.
  // Sequence 1: (2,1), (1,0), (1,2): expert 1 takes tokens 3 and 4, token 5's is dropped.
  Tensor ex = ids({6, 2}, {0, 1, 0, 2, 0, 1, 2, 1, 1, 0, 1, 2});
  Tensor slot = ids({6, 2}, std::vector<std::int32_t>(12, 99)), kept = ids({3}, {9, 9, 9}), routed = ids({3}, {9, 9, 9});
  ops::moe_plan(ctx, ex, 3, 2, slot, kept, routed);
  EXPECT_EQ(ints(routed), (std::vector<std::int32_t>{4, 5, 3}));
  EXPECT_EQ(ints(kept), (std::vector<std::int32_t>{3, 4, 3}));
  // Rows expert-major, token order within an expert: expert 0 = t0, t1, t4; expert 1 = t0, t2, t3,
  // t4; expert 2 = t1, t3, t5. Dropped: t2's expert 0, t5's expert 1.
  EXPECT_EQ(ints(slot), (std::vector<std::int32_t>{0, 3, 1, 7, -1, 4, 8, 5, 6, 2, -1, 9}));
  // Dropless (capacity = every assignment of a sequence): nothing dropped, same order.
  ops::moe_plan(ctx, ex, 3, 6, slot, kept, routed);
  EXPECT_EQ(ints(kept), ints(routed));
  EXPECT_EQ(ints(slot), (std::vector<std::int32_t>{0, 4, 1, 9, 2, 5, 10, 6, 7, 3, 8, 11}));
  // One group of all six tokens with capacity 2: the first two of each expert overall.
  ops::moe_plan(ctx, ex, 6, 2, slot, kept, routed);
  EXPECT_EQ(ints(kept), (std::vector<std::int32_t>{2, 2, 2}));
  EXPECT_EQ(ints(slot), (std::vector<std::int32_t>{0, 2, 1, 4, -1, 3, 5, -1, -1, -1, -1, -1}));
}

TEST_F(MoeOpsTest, GatherCombineAndTheirBackwardsMatchFiniteDifferences) {
  const std::int64_t N = 4, d = 3, k = 2;
  // Slots of 6 kept rows; token 2's second assignment is dropped, token 3 keeps none.
  Tensor slot = ids({N, k}, {0, 3, 1, 4, 2, -1, -1, -1});
  const std::int64_t M = 5;
  Tensor x = randn({N, d}, 3), xe = poisoned({M, d}), r = randn({M, d}, 4);
  ops::moe_gather(ctx, x, slot, xe);
  Tensor dx = poisoned({N, d});
  ops::moe_gather_backward(ctx, r, slot, dx, false);
  expect_gradcheck_ok(gradcheck([&] { ops::moe_gather(ctx, x, slot, xe); return dot(xe, r); }, {{"x", &x, &dx}}));
  // Accumulating adds to what is there.
  Tensor acc = full({N, d}, 1.0);
  ops::moe_gather_backward(ctx, r, slot, acc, true);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_NEAR(values(acc)[i], values(dx)[i] + 1.0, 1e-15);
  EXPECT_EQ(values(dx)[9], 0.0);   // token 3: every assignment dropped

  Tensor ye = randn({M, d}, 5), gates = randn({N, k}, 6), out = poisoned({N, d}), rout = randn({N, d}, 7);
  Tensor dye = full({M, d}, 0.0), dg = poisoned({N, k});
  ops::moe_combine_backward(ctx, rout, ye, slot, gates, dye, dg);
  expect_gradcheck_ok(gradcheck([&] { ops::moe_combine(ctx, ye, slot, gates, out); return dot(out, rout); },
                                {{"ye", &ye, &dye}, {"gates", &gates, &dg}}));
  ops::moe_combine(ctx, ye, slot, gates, out);
  for (std::int64_t c = 0; c < d; ++c) EXPECT_EQ(values(out)[static_cast<std::size_t>(3 * d + c)], 0.0);
}

// f = <gates, r> + scale * (aux * terms[0] + z * terms[1]) for fixed choices of experts: the
// function whose logit gradient ops::moe_route_backward gives.
TEST_F(MoeOpsTest, RouteBackwardMatchesFiniteDifferencesThroughGatesAndLosses) {
  const std::int64_t T = 3, B = 2, N = B * T, E = 5, k = 2;
  const double aux = 0.3, zc = 0.07, scale = 0.25;
  Tensor z = randn({N, E}, 8, 1.5), p = poisoned({N, E}), lse = poisoned({N}), g = poisoned({N, k});
  Tensor ex = ids({N, k}, std::vector<std::int32_t>(N * k, 0)), terms = poisoned({3});
  Tensor rg = randn({N, k}, 9);
  ops::moe_route(ctx, z, p, lse, ex, g);
  const auto chosen = ints(ex);
  Tensor dz = poisoned({N, E});
  ops::moe_route_backward(ctx, p, lse, ex, g, rg, T, aux, zc, scale, dz);
  auto f = [&] {
    ops::moe_route(ctx, z, p, lse, ex, g);
    EXPECT_EQ(ints(ex), chosen);   // the step never changes the choice (no near ties here)
    ops::moe_router_losses(ctx, p, lse, ex, T, aux, zc, terms);
    return dot(g, rg) + scale * values(terms)[2];
  };
  expect_gradcheck_ok(gradcheck(f, {{"logits", &z, &dz}}));
}

TEST_F(MoeOpsTest, RouterLossesAreOneAtPerfectBalanceAndPerSequence) {
  // 2 sequences of 2 tokens, E = 2, k = 1, uniform probabilities, each expert chosen once per
  // sequence: the balance term is T per sequence (1 each after dividing by the tokens).
  Tensor p = full({4, 2}, 0.5), lse = full({4}, 2.0), ex = ids({4, 1}, {0, 1, 1, 0}), terms = poisoned({3});
  ops::moe_router_losses(ctx, p, lse, ex, 2, 0.5, 0.25, terms);
  EXPECT_NEAR(values(terms)[0], 4.0, 1e-15);   // 2 sequences x T = 2
  EXPECT_NEAR(values(terms)[1], 16.0, 1e-15);  // 4 rows x 2^2
  EXPECT_NEAR(values(terms)[2], 0.5 * 4.0 + 0.25 * 16.0, 1e-15);
  // Skewed: sequence 0 sends both tokens to expert 0 with probabilities (0.75, 0.25):
  // P = (1.5, 0.5), c = (2, 0) -> 2/2 * 3 = 3; sequence 1 balanced -> 2.
  Tensor q = Tensor::empty({4, 2}, DType::f64, alloc, "test");
  const double qv[8] = {0.75, 0.25, 0.75, 0.25, 0.5, 0.5, 0.5, 0.5};
  std::copy(qv, qv + 8, q.data_as<double>());
  Tensor skew = ids({4, 1}, {0, 0, 1, 0});
  ops::moe_router_losses(ctx, q, lse, skew, 2, 0.5, 0.25, terms);
  EXPECT_NEAR(values(terms)[0], 3.0 + 2.0, 1e-15);
  // The groups are the sequences: the same rows read as one sequence of 4 give another value
  // (P = (2.5, 1.5), c = (3, 1) -> 2/4 * 9).
  ops::moe_router_losses(ctx, q, lse, skew, 4, 0.5, 0.25, terms);
  EXPECT_NEAR(values(terms)[0], 4.5, 1e-15);
}

TEST_F(MoeOpsTest, Fp32AgreesWithFp64) {
  const std::int64_t T = 4, N = 8, E = 4, k = 2;
  Tensor z = randn({N, E}, 10), p = poisoned({N, E}), lse = poisoned({N}), g = poisoned({N, k});
  Tensor ex = ids({N, k}, std::vector<std::int32_t>(N * k, 0)), rg = randn({N, k}, 11), dz = poisoned({N, E});
  ops::moe_route(ctx, z, p, lse, ex, g);
  ops::moe_route_backward(ctx, p, lse, ex, g, rg, T, 0.1, 0.01, 1.0, dz);
  const auto F = DType::f32;
  Tensor z32 = as(z, F), p32 = poisoned({N, E}, F), l32 = poisoned({N}, F), g32 = poisoned({N, k}, F);
  Tensor ex32 = ids({N, k}, std::vector<std::int32_t>(N * k, 0)), rg32 = as(rg, F), dz32 = poisoned({N, E}, F);
  ops::moe_route(ctx, z32, p32, l32, ex32, g32);
  ops::moe_route_backward(ctx, p32, l32, ex32, g32, rg32, T, 0.1, 0.01, 1.0, dz32);
  EXPECT_EQ(ints(ex32), ints(ex));
  EXPECT_LT(max_rel_diff(p32, p), 1e-6);
  EXPECT_LT(max_rel_diff(g32, g), 1e-6);
  EXPECT_LT(max_rel_diff(dz32, dz), 1e-5);
}

TEST_F(MoeOpsTest, BadArgumentsThrow) {
  Tensor z = randn({3, 4}, 12), p = poisoned({3, 4}), lse = poisoned({3}), g = poisoned({3, 5});
  Tensor ex = ids({3, 5}, std::vector<std::int32_t>(15, 0));
  EXPECT_THROW(ops::moe_route(ctx, z, p, lse, ex, g), Error);   // k = 5 > E = 4
  Tensor bad = ids({2, 1}, {0, 4}), slot = ids({2, 1}, {0, 0}), kept = ids({4}, {0, 0, 0, 0}), routed = ids({4}, {0, 0, 0, 0});
  EXPECT_THROW(ops::moe_plan(ctx, bad, 1, 1, slot, kept, routed), Error);   // expert 4 of 4
  Tensor ok = ids({2, 1}, {0, 1});
  EXPECT_THROW(ops::moe_plan(ctx, ok, 3, 1, slot, kept, routed), Error);   // 2 rows, groups of 3
}

// ops::moe_experts: each expert's SwiGLU over its own rows (an expert without rows included), the
// backward by central differences of <y, r> through x and the three stacked weights, and the
// accumulate rule (adds to every expert's gradients; an expert without rows keeps its own).
TEST_F(MoeOpsTest, ExpertsAndTheirBackwardMatchFiniteDifferences) {
  const std::vector<std::int64_t> rows = {2, 0, 3};
  const std::int64_t El = 3, Me = 5, d = 4, Fe = 3;
  Tensor x = randn({Me, d}, 21), W1 = randn({El, Fe, d}, 22, 0.7), W3 = randn({El, Fe, d}, 23, 0.7);
  Tensor W2 = randn({El, d, Fe}, 24, 0.7), r = randn({Me, d}, 25);
  Tensor a = poisoned({Me, Fe}), b = poisoned({Me, Fe}), g = poisoned({Me, Fe}), y = poisoned({Me, d});
  ops::moe_experts(ctx, x, rows, W1, W3, W2, a, b, g, y);
  // Row 3 (expert 2's second row) by hand: silu(a) * b through W2[2].
  const auto xv = values(x), w1 = values(W1), w3 = values(W3), w2 = values(W2), yv = values(y);
  for (std::int64_t c = 0; c < d; ++c) {
    double want = 0;
    for (std::int64_t f = 0; f < Fe; ++f) {
      double av = 0, bv = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        av += xv[static_cast<std::size_t>(3 * d + i)] * w1[static_cast<std::size_t>((2 * Fe + f) * d + i)];
        bv += xv[static_cast<std::size_t>(3 * d + i)] * w3[static_cast<std::size_t>((2 * Fe + f) * d + i)];
      }
      want += av / (1 + std::exp(-av)) * bv * w2[static_cast<std::size_t>((2 * d + c) * Fe + f)];
    }
    EXPECT_NEAR(yv[static_cast<std::size_t>(3 * d + c)], want, 1e-12);
  }
  Tensor dg = poisoned({Me, Fe}), da = poisoned({Me, Fe}), db = poisoned({Me, Fe}), dx = poisoned({Me, d});
  Tensor G1 = poisoned(W1.shape()), G3 = poisoned(W3.shape()), G2 = poisoned(W2.shape());
  ops::moe_experts_backward(ctx, x, rows, W1, W3, W2, a, b, g, r, dg, da, db, dx, G1, G3, G2, false);
  auto f = [&] {
    ops::moe_experts(ctx, x, rows, W1, W3, W2, a, b, g, y);
    return dot(y, r);
  };
  expect_gradcheck_ok(gradcheck(f, {{"x", &x, &dx}, {"W1", &W1, &G1}, {"W3", &W3, &G3}, {"W2", &W2, &G2}}));
  for (const Tensor* G : {&G1, &G3, &G2})   // expert 1 has no rows: zero gradients
    for (std::int64_t i = G->numel() / El; i < 2 * G->numel() / El; ++i) EXPECT_EQ(values(*G)[static_cast<std::size_t>(i)], 0.0);
  // Accumulating: every gradient grows by the same product, the empty expert's stays as it was.
  Tensor H1 = full(W1.shape(), 0.5), H3 = full(W3.shape(), 0.5), H2 = full(W2.shape(), 0.5);
  ops::moe_experts_backward(ctx, x, rows, W1, W3, W2, a, b, g, r, dg, da, db, dx, H1, H3, H2, true);
  for (const auto& [G, H] : {std::pair{&G1, &H1}, {&G3, &H3}, {&G2, &H2}}) {
    const auto gv = values(*G), hv = values(*H);
    for (std::size_t i = 0; i < gv.size(); ++i) EXPECT_NEAR(hv[i], gv[i] + 0.5, 1e-14);
  }
}

}  // namespace
}  // namespace lmscale::test
