// detail::expert_products (src/ops/expert_products.h), the host side of the grouped expert GEMMs
// (model.moe_expert_gemm = grouped): which products a row split makes (none for an empty expert),
// how equal row counts group, the operands' offsets, and the layouts of every projection, run
// here by a float64 column-major GEMM and compared with ops::moe_experts and its backward (the
// loop) on the CPU. ops::moe_experts ignores ExpertGemm on the CPU: checked bitwise.
#include <gtest/gtest.h>

#include <cmath>

#include "../../src/ops/expert_products.h"
#include "lmscale/core/error.h"
#include "lmscale/ops/moe_experts.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using ops::detail::expert_products;
using ops::detail::expert_projection_specs;
using ops::detail::ExpertProductSpec;
using ops::detail::GroupedProducts;

// C = alpha op(A) op(B) + beta C for every problem, column-major, in float64; a, b, c: the
// copies' base pointers.
void run_products(const GroupedProducts& p, const std::vector<const double*>& a, const std::vector<const double*>& b,
                  const std::vector<double*>& c) {
  std::size_t i = 0;
  for (const auto& grp : p.groups)
    for (int j = 0; j < grp.size; ++j, ++i) {
      const auto& pr = p.problems[i];
      const double* A = a[static_cast<std::size_t>(pr.copy)] + pr.a;
      const double* B = b[static_cast<std::size_t>(pr.copy)] + pr.b;
      double* C = c[static_cast<std::size_t>(pr.copy)] + pr.c;
      for (std::int64_t n = 0; n < grp.n; ++n)
        for (std::int64_t m = 0; m < grp.m; ++m) {
          double s = 0;
          for (std::int64_t k = 0; k < grp.k; ++k)
            s += (p.trans_a ? A[k + m * grp.lda] : A[m + k * grp.lda]) * (p.trans_b ? B[n + k * grp.ldb] : B[k + n * grp.ldb]);
          double& out = C[m + n * grp.ldc];
          out = p.alpha * s + (p.beta != 0.f ? p.beta * out : 0.0);
        }
    }
  ASSERT_EQ(i, p.problems.size());
}

TEST(ExpertProducts, EmptyExpertsHaveNoProductsAndEqualRowsShareAGroup) {
  const std::int64_t d = 8, Fe = 6;
  const auto s = expert_projection_specs(d, Fe, false);
  const std::vector<std::int64_t> rows = {3, 0, 3, 5, 0};
  const GroupedProducts up = expert_products(rows, s.up);
  // Experts 0 and 2 (3 rows each, consecutive among the non-empty) share a group; w1 and w3 are
  // two problems per expert.
  ASSERT_EQ(up.groups.size(), 2u);
  EXPECT_EQ(up.groups[0].size, 4);
  EXPECT_EQ(up.groups[1].size, 2);
  EXPECT_EQ(up.groups[0].m, Fe);
  EXPECT_EQ(up.groups[0].n, 3);
  EXPECT_EQ(up.groups[1].n, 5);
  EXPECT_EQ(up.groups[0].k, d);
  ASSERT_EQ(up.problems.size(), 6u);
  const std::vector<std::int64_t> expert = {0, 0, 2, 2, 3, 3}, first_row = {0, 0, 3, 3, 6, 6};
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(up.problems[i].expert, expert[i]);
    EXPECT_EQ(up.problems[i].copy, static_cast<int>(i % 2));
    EXPECT_EQ(up.problems[i].a, expert[i] * Fe * d);   // W[e]
    EXPECT_EQ(up.problems[i].b, first_row[i] * d);     // x's rows of e
    EXPECT_EQ(up.problems[i].c, first_row[i] * Fe);    // a's (b's) rows of e
  }
  // A weight gradient varies k: experts with equal rows group, the others do not.
  const GroupedProducts w2 = expert_products({2, 2, 0, 4}, s.grad_w2);
  ASSERT_EQ(w2.groups.size(), 2u);
  EXPECT_EQ(w2.groups[0].k, 2);
  EXPECT_EQ(w2.groups[0].size, 2);
  EXPECT_EQ(w2.groups[1].k, 4);
  EXPECT_EQ(w2.problems[2].c, 3 * d * Fe);   // G2[3]
  EXPECT_EQ(w2.problems[2].a, 4 * Fe);       // g's rows from 4
  EXPECT_EQ(w2.beta, 0.f);
  EXPECT_EQ(expert_projection_specs(d, Fe, true).grad_w13.beta, 1.f);
  // No rows at all: nothing to run.
  const GroupedProducts none = expert_products({0, 0, 0}, s.down);
  EXPECT_TRUE(none.groups.empty());
  EXPECT_TRUE(none.problems.empty());
}

TEST(ExpertProducts, RefusesNegativeRowsAndSpecsWithoutRows) {
  const auto s = expert_projection_specs(4, 4, false);
  EXPECT_THROW(expert_products({2, -1}, s.up), Error);
  ExpertProductSpec fixed = s.up;
  fixed.n = ops::detail::fixed_dim(4);
  EXPECT_THROW(expert_products({2, 1}, fixed), Error);
}

using ExpertProductsOps = OpsTest;

// Every projection's products, run in float64 from the specs, against the loop of
// ops::moe_experts(_backward) on the CPU (fresh and accumulated gradients), uneven and empty
// experts included.
TEST_F(ExpertProductsOps, ProjectionsReproduceTheExpertsLoop) {
  const std::vector<std::int64_t> rows = {3, 0, 5, 1, 0, 3};
  const std::int64_t El = 6, Me = 12, d = 5, Fe = 7;
  const Tensor x = randn({Me, d}, 31), W1 = randn({El, Fe, d}, 32, 0.5), W3 = randn({El, Fe, d}, 33, 0.5);
  const Tensor W2 = randn({El, d, Fe}, 34, 0.5), dy = randn({Me, d}, 35);
  Tensor a = poisoned({Me, Fe}), b = poisoned({Me, Fe}), g = poisoned({Me, Fe}), y = poisoned({Me, d});
  ops::moe_experts(ctx, x, rows, W1, W3, W2, a, b, g, y);
  const auto ptr = [](const Tensor& t) { return t.data_as<double>(); };

  // Forward: a, b by `up`, the SwiGLU, y by `down`.
  const auto s0 = expert_projection_specs(d, Fe, false);
  std::vector<double> pa(static_cast<std::size_t>(Me * Fe)), pb(pa.size()), pg(pa.size()), py(static_cast<std::size_t>(Me * d));
  run_products(expert_products(rows, s0.up), {ptr(W1), ptr(W3)}, {ptr(x), ptr(x)}, {pa.data(), pb.data()});
  for (std::size_t i = 0; i < pa.size(); ++i) pg[i] = pa[i] / (1 + std::exp(-pa[i])) * pb[i];
  run_products(expert_products(rows, s0.down), {ptr(W2)}, {pg.data()}, {py.data()});
  const auto close = [](const std::vector<double>& got, const std::vector<double>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << what << " [" << i << "]";
  };
  close(pa, values(a), "a");
  close(pb, values(b), "b");
  close(py, values(y), "y");

  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    Tensor dg = poisoned({Me, Fe}), da = poisoned({Me, Fe}), db = poisoned({Me, Fe}), dx = poisoned({Me, d});
    Tensor G1 = full(W1.shape(), 0.25), G3 = full(W3.shape(), 0.25), G2 = full(W2.shape(), 0.25);
    ops::moe_experts_backward(ctx, x, rows, W1, W3, W2, a, b, g, dy, dg, da, db, dx, G1, G3, G2, accumulate);
    const auto s = expert_projection_specs(d, Fe, accumulate);
    std::vector<double> pdg(pa.size()), pda(pa.size()), pdb(pa.size()), pdx(py.size());
    // Empty experts have no products: their gradients are the caller's (zeroed unless accumulating).
    std::vector<double> g1(static_cast<std::size_t>(El * Fe * d), accumulate ? 0.25 : 0.0), g3 = g1, g2 = g1;
    run_products(expert_products(rows, s.grad_g), {ptr(W2)}, {ptr(dy)}, {pdg.data()});
    run_products(expert_products(rows, s.grad_w2), {pg.data()}, {ptr(dy)}, {g2.data()});
    for (std::size_t i = 0; i < pa.size(); ++i) {   // the SwiGLU's backward
      const double sg = 1 / (1 + std::exp(-pa[i]));
      pda[i] = pdg[i] * pb[i] * sg * (1 + pa[i] * (1 - sg));
      pdb[i] = pdg[i] * pa[i] * sg;
    }
    ExpertProductSpec gx = s.grad_x;
    run_products(expert_products(rows, gx), {ptr(W1)}, {pda.data()}, {pdx.data()});
    gx.beta = 1.f;
    run_products(expert_products(rows, gx), {ptr(W3)}, {pdb.data()}, {pdx.data()});
    run_products(expert_products(rows, s.grad_w13), {ptr(x), ptr(x)}, {pda.data(), pdb.data()}, {g1.data(), g3.data()});
    close(pdg, values(dg), "dg");
    close(pdx, values(dx), "dx");
    close(g1, values(G1), "G1");
    close(g3, values(G3), "G3");
    close(g2, values(G2), "G2");
  }
}

// On the CPU the key changes nothing: the grouped form runs the loop, bit for bit.
TEST_F(ExpertProductsOps, CpuIgnoresTheGroupedForm) {
  const std::vector<std::int64_t> rows = {2, 0, 4};
  const std::int64_t El = 3, Me = 6, d = 4, Fe = 5;
  const Tensor x = randn({Me, d}, 41), W1 = randn({El, Fe, d}, 42), W3 = randn({El, Fe, d}, 43);
  const Tensor W2 = randn({El, d, Fe}, 44), dy = randn({Me, d}, 45);
  std::vector<std::vector<double>> out[2];
  for (int form = 0; form < 2; ++form) {
    const auto how = form == 0 ? ops::ExpertGemm::loop : ops::ExpertGemm::grouped;
    Tensor a = poisoned({Me, Fe}), b = poisoned({Me, Fe}), g = poisoned({Me, Fe}), y = poisoned({Me, d});
    ops::moe_experts(ctx, x, rows, W1, W3, W2, a, b, g, y, how);
    Tensor dg = poisoned({Me, Fe}), da = poisoned({Me, Fe}), db = poisoned({Me, Fe}), dx = poisoned({Me, d});
    Tensor G1 = poisoned(W1.shape()), G3 = poisoned(W3.shape()), G2 = poisoned(W2.shape());
    ops::moe_experts_backward(ctx, x, rows, W1, W3, W2, a, b, g, dy, dg, da, db, dx, G1, G3, G2, false, how);
    out[form] = {values(y), values(dx), values(G1), values(G3), values(G2)};
  }
  EXPECT_EQ(out[0], out[1]);
}

}  // namespace
}  // namespace lmscale::test
