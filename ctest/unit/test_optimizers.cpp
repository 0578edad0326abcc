// SGD, LARS and LAMB (optim/*.h, ops/optimizer_steps.h) in float64 on the CPU against the papers'
// formulas worked out here element by element: several steps, weight decay, Nesterov, the norm
// exclusion, zero norms (trust ratio 1), a hand-worked first step with its numbers, and a step
// split into shards whose per-parameter sums are added before set_norms (the sharded path) against
// the whole step. AdamW's interface wrapper is checked to give ops::adamw's numbers exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lmscale/io/deck.h"
#include "lmscale/ops/optimizer_steps.h"
#include "lmscale/optim/adamw.h"
#include "lmscale/optim/lamb.h"
#include "lmscale/optim/lars.h"
#include "lmscale/optim/optimizer.h"
#include "lmscale/optim/sgd.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using Vec = std::vector<double>;

class OptimizerTest : public OpsTest {
 protected:
  Tensor from(const Vec& v) {
    Tensor x = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::f64, alloc, "test");
    std::copy(v.begin(), v.end(), x.data_as<double>());
    return x;
  }
  static Vec grad_at(int step, std::size_t n) {   // deterministic gradients, different every step
    Vec g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(1.3 * static_cast<double>(i) + 0.7 * step) * (0.5 + 0.1 * step);
    return g;
  }
};

double norm(const Vec& x, std::size_t a, std::size_t b) {
  double s = 0;
  for (std::size_t i = a; i < b; ++i) s += x[i] * x[i];
  return std::sqrt(s);
}

void expect_near(const Vec& got, const Vec& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " element " << i;
}

// ---- SGD (torch.optim.SGD semantics) -------------------------------------------------------------

TEST_F(OptimizerTest, SgdHandWorkedFirstStep) {
  // lr 0.1, momentum 0.9, wd 0.01, grad_scale 2: g' = 2 grad + 0.01 p; buf = g' (zero buffer);
  // p -= 0.1 buf. p = 1, grad = 0.5: g' = 1.01, p = 1 - 0.101 = 0.899. Nesterov: d = g' + 0.9 buf = 1.919.
  for (bool nesterov : {false, true}) {
    OptimConfig c;
    c.name = OptimizerName::sgd;
    c.momentum = 0.9;
    c.weight_decay = 0.01;
    c.nesterov = nesterov;
    optim::Sgd opt(c, 2, DType::f64, ctx);
    Tensor p = from({1.0, -2.0}), g = from({0.5, 0.0});
    opt.step(ctx, p, g, nullptr, 0.1, 2.0);
    const double want0 = nesterov ? 1.0 - 0.1 * 1.919 : 0.899;
    const double want1 = nesterov ? -2.0 - 0.1 * (1.9 * -0.02) : -2.0 - 0.1 * -0.02;   // decay only
    EXPECT_NEAR(values(p)[0], want0, 1e-15) << nesterov;
    EXPECT_NEAR(values(p)[1], want1, 1e-15) << nesterov;
    EXPECT_NEAR(values(opt.state(0))[0], 1.01, 1e-15);
  }
}

TEST_F(OptimizerTest, SgdSeveralStepsMatchTorchFormula) {
  const std::size_t n = 7;
  for (bool nesterov : {false, true})
    for (double mu : {0.0, 0.8}) {
      if (nesterov && mu == 0) continue;
      OptimConfig c;
      c.name = OptimizerName::sgd;
      c.momentum = mu;
      c.nesterov = nesterov;
      c.weight_decay = 0.05;
      auto opt = optim::make_optimizer(c, static_cast<std::int64_t>(n), DType::f64, ctx, 0, {});
      Vec p(n), buf(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) p[i] = 0.3 * static_cast<double>(i) - 1.0;
      Tensor pt = from(p);
      for (int t = 1; t <= 4; ++t) {
        const Vec g = grad_at(t, n);
        const double lr = 0.05 / t, gs = 0.5;
        Tensor gt = from(g);
        opt->step(ctx, pt, gt, nullptr, lr, gs);
        for (std::size_t i = 0; i < n; ++i) {   // torch: d_p = g + wd p; buf = mu buf + d_p; ...
          double d = g[i] * gs + 0.05 * p[i];
          buf[i] = t == 1 ? d : mu * buf[i] + d;
          d = nesterov ? d + mu * buf[i] : buf[i];
          p[i] -= lr * d;
        }
      }
      expect_near(values(pt), p, 1e-14, "sgd params");
      expect_near(values(opt->state(0)), buf, 1e-14, "sgd momentum buffer");
    }
}

// ---- LARS ----------------------------------------------------------------------------------------

// Two parameters: [0, 5) a matrix (layer-wise), [5, 8) an RMSNorm gain (excluded).
std::vector<optim::ParamSegment> two_params() { return {{0, 5, 0, true}, {5, 3, 1, false}}; }

TEST_F(OptimizerTest, LarsHandWorkedFirstStep) {
  // One layer-wise parameter w = (3, 4), ||w|| = 5; g = (0, 1) * grad_scale 2 -> (0, 2), ||g|| = 2;
  // wd 0.1, eta 0.01: local_lr = 0.01 * 5 / (2 + 0.5) = 0.02. lr 1, zero buffer:
  // buf = 0.02 (g + 0.1 w) = 0.02 (0.3, 2.4) = (0.006, 0.048); w = (2.994, 3.952).
  OptimConfig c;
  c.name = OptimizerName::lars;
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  c.trust_coefficient = 0.01;
  optim::Lars opt(c, 2, DType::f64, ctx, 1, {{0, 2, 0, true}});
  Tensor p = from({3.0, 4.0}), g = from({0.0, 1.0});
  opt.step(ctx, p, g, nullptr, 1.0, 2.0);
  EXPECT_NEAR(opt.trust_ratio(0), 0.02, 1e-16);
  EXPECT_NEAR(values(p)[0], 2.994, 1e-15);
  EXPECT_NEAR(values(p)[1], 3.952, 1e-15);
}

TEST_F(OptimizerTest, LarsSeveralStepsWithExclusionAndZeroNorms) {
  const std::size_t n = 8;
  OptimConfig c;
  c.name = OptimizerName::lars;
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  c.trust_coefficient = 0.02;
  auto opt = optim::make_optimizer(c, static_cast<std::int64_t>(n), DType::f64, ctx, 2, two_params());
  ASSERT_TRUE(opt->layerwise());
  Vec p = {0.5, -0.25, 1.5, 0.75, -1.0, 1.0, 1.0, 1.0}, buf(n, 0.0);
  Tensor pt = from(p);
  for (int t = 1; t <= 4; ++t) {
    Vec g = grad_at(t, n);
    const double lr = 0.1, gs = 0.75;
    Tensor gt = from(g);
    opt->step(ctx, pt, gt, nullptr, lr, gs);
    for (auto& x : g) x *= gs;
    const double wn = norm(p, 0, 5), gn = norm(g, 0, 5);
    const double ratio = 0.02 * wn / (gn + 0.01 * wn);
    for (std::size_t i = 0; i < n; ++i) {
      const bool layer = i < 5;
      const double d = g[i] + (layer ? 0.01 * p[i] : 0.0);
      buf[i] = 0.9 * buf[i] + lr * (layer ? ratio : 1.0) * d;
      p[i] -= buf[i];
    }
  }
  expect_near(values(pt), p, 1e-14, "lars params");
  expect_near(values(opt->state(0)), buf, 1e-14, "lars buffer");

  // Zero weights: ||w|| = 0 -> ratio 1 (not 0, which would freeze the parameter forever).
  optim::Lars zero_w(c, 2, DType::f64, ctx, 1, {{0, 2, 0, true}});
  Tensor pz = from({0.0, 0.0}), gz = from({1.0, -1.0});
  zero_w.step(ctx, pz, gz, nullptr, 0.5, 1.0);
  EXPECT_EQ(zero_w.trust_ratio(0), 1.0);
  EXPECT_NEAR(values(pz)[0], -0.5, 1e-16);
  // Zero gradient and no decay: the denominator is 0 -> ratio 1, and nothing moves.
  c.weight_decay = 0;
  optim::Lars zero_g(c, 2, DType::f64, ctx, 1, {{0, 2, 0, true}});
  Tensor pg = from({1.0, 2.0}), gg = from({0.0, 0.0});
  zero_g.step(ctx, pg, gg, nullptr, 0.5, 1.0);
  EXPECT_EQ(zero_g.trust_ratio(0), 1.0);
  EXPECT_EQ(values(pg), (Vec{1.0, 2.0}));
}

// ---- LAMB ----------------------------------------------------------------------------------------

TEST_F(OptimizerTest, LambHandWorkedFirstStep) {
  // t = 1: m = 0.1 g, v = 0.001 g^2 -> m_hat = g, v_hat = g^2, r = g / (|g| + eps) = sign(g) (eps
  // tiny). w = (3, 4), g = (1, -2): r = (1, -1) (to 1e-12); wd 0.1: u = r + 0.1 w = (1.3, -0.6),
  // ||u|| = sqrt(2.05), ||w|| = 5, ratio = 5 / sqrt(2.05). lr 0.01: w -= 0.01 ratio u.
  OptimConfig c;
  c.name = OptimizerName::lamb;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-12;
  c.weight_decay = 0.1;
  optim::Lamb opt(c, 2, DType::f64, ctx, 1, {{0, 2, 0, true}});
  Tensor p = from({3.0, 4.0}), g = from({1.0, -2.0});
  opt.step(ctx, p, g, nullptr, 0.01, 1.0);
  const double ratio = 5.0 / std::sqrt(2.05);
  EXPECT_NEAR(opt.trust_ratio(0), ratio, 1e-11);
  EXPECT_NEAR(values(p)[0], 3.0 - 0.01 * ratio * 1.3, 1e-12);
  EXPECT_NEAR(values(p)[1], 4.0 - 0.01 * ratio * -0.6, 1e-12);
}

// LAMB reference: the paper's Algorithm 2 for the two-parameter layout, `steps` steps.
struct LambRef {
  Vec p, m, v;
  void step(const Vec& grad, double gs, int t, double lr, double b1, double b2, double eps, double wd) {
    const std::size_t n = p.size();
    Vec u(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double g = grad[i] * gs;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double r = (m[i] / (1 - std::pow(b1, t))) / (std::sqrt(v[i] / (1 - std::pow(b2, t))) + eps);
      u[i] = r + (i < 5 ? wd * p[i] : 0.0);
    }
    const double wn = norm(p, 0, 5), un = norm(u, 0, 5);
    const double ratio = wn > 0 && un > 0 ? wn / un : 1.0;
    for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (i < 5 ? ratio : 1.0) * u[i];
  }
};

TEST_F(OptimizerTest, LambSeveralStepsWithExclusion) {
  const std::size_t n = 8;
  OptimConfig c;
  c.name = OptimizerName::lamb;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-6;
  c.weight_decay = 0.02;
  auto opt = optim::make_optimizer(c, static_cast<std::int64_t>(n), DType::f64, ctx, 2, two_params());
  LambRef ref{{0.5, -0.25, 1.5, 0.75, -1.0, 1.0, 0.9, 1.1}, Vec(n, 0.0), Vec(n, 0.0)};
  Tensor pt = from(ref.p);
  for (int t = 1; t <= 5; ++t) {
    const Vec g = grad_at(t, n);
    Tensor gt = from(g);
    opt->step(ctx, pt, gt, nullptr, 0.01, 0.5);
    ref.step(g, 0.5, t, 0.01, 0.9, 0.95, 1e-6, 0.02);
  }
  expect_near(values(pt), ref.p, 1e-13, "lamb params");
  expect_near(values(opt->state(0)), ref.m, 1e-14, "lamb m");
  expect_near(values(opt->state(1)), ref.v, 1e-14, "lamb v");
}

TEST_F(OptimizerTest, LambZeroNormsGiveRatioOne) {
  OptimConfig c;
  c.name = OptimizerName::lamb;
  c.weight_decay = 0.0;
  // Zero weights: ||w|| = 0 -> ratio 1 (plain Adam direction).
  optim::Lamb zw(c, 2, DType::f64, ctx, 1, {{0, 2, 0, true}});
  Tensor p = from({0.0, 0.0}), g = from({1.0, -1.0});
  zw.step(ctx, p, g, nullptr, 0.1, 1.0);
  EXPECT_EQ(zw.trust_ratio(0), 1.0);
  EXPECT_NEAR(values(p)[0], -0.1, 1e-6);
  // Zero gradient, no decay: ||u|| = 0 -> ratio 1, no movement.
  optim::Lamb zu(c, 2, DType::f64, ctx, 1, {{0, 2, 0, true}});
  Tensor p2 = from({1.0, 2.0}), g2 = from({0.0, 0.0});
  zu.step(ctx, p2, g2, nullptr, 0.1, 1.0);
  EXPECT_EQ(zu.trust_ratio(0), 1.0);
  EXPECT_EQ(values(p2), (Vec{1.0, 2.0}));
}

// ---- sharded == whole ------------------------------------------------------------------------------

// The state range split at arbitrary points (cutting parameters) into optimizers over each piece,
// their norm sums added (what the all-reduce does), against one optimizer over everything.
TEST_F(OptimizerTest, ShardedNormsEqualWhole) {
  const std::int64_t n = 8;
  for (OptimizerName name : {OptimizerName::lars, OptimizerName::lamb, OptimizerName::sgd, OptimizerName::adamw}) {
    SCOPED_TRACE(to_string(name));
    OptimConfig c;
    c.name = name;
    c.weight_decay = 0.03;
    auto whole = optim::make_optimizer(c, n, DType::f64, ctx, 2, two_params());
    const std::vector<std::int64_t> cuts = {0, 3, 6, 8};   // [0,3) [3,6) [6,8): parameter 0 cut, 1 cut
    std::vector<std::unique_ptr<optim::Optimizer>> shards;
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      std::vector<optim::ParamSegment> segs;
      for (const auto& s : two_params()) {
        const std::int64_t a = std::max(s.offset, cuts[k]), b = std::min(s.offset + s.numel, cuts[k + 1]);
        if (a < b) segs.push_back({a - cuts[k], b - a, s.param, s.layerwise});
      }
      shards.push_back(optim::make_optimizer(c, cuts[k + 1] - cuts[k], DType::f64, ctx, 2, segs));
    }
    Tensor pw = randn({n}, 5), ps = clone(pw);
    for (int t = 1; t <= 3; ++t) {
      Tensor g = randn({n}, 100 + static_cast<std::uint64_t>(t));
      whole->step(ctx, pw, g, nullptr, 0.05, 0.5);
      std::vector<double> total(whole->norm_slots(), 0.0);
      for (std::size_t k = 0; k < shards.size(); ++k) {
        Tensor pk = ps.flat_range(cuts[k], cuts[k + 1] - cuts[k]), gk = g.flat_range(cuts[k], cuts[k + 1] - cuts[k]);
        shards[k]->begin_step();
        std::vector<double> part(shards[k]->norm_slots(), 0.0);
        if (shards[k]->layerwise()) shards[k]->accumulate_norms(ctx, pk, gk, 0, 0.5, part);
        for (std::size_t i = 0; i < part.size(); ++i) total[i] += part[i];
      }
      for (std::size_t k = 0; k < shards.size(); ++k) {
        Tensor pk = ps.flat_range(cuts[k], cuts[k + 1] - cuts[k]), gk = g.flat_range(cuts[k], cuts[k + 1] - cuts[k]);
        if (shards[k]->layerwise()) shards[k]->set_norms(total);
        shards[k]->step_range(ctx, pk, gk, nullptr, 0, 0.05, 0.5);
      }
    }
    expect_near(values(ps), values(pw), 1e-14, "sharded vs whole");
  }
}

TEST_F(OptimizerTest, AdamWThroughTheInterfaceIsOpsAdamW) {
  OptimConfig c;   // adamw defaults
  auto opt = optim::make_optimizer(c, 5, DType::f64, ctx, 0, {});
  EXPECT_EQ(opt->name(), "adamw");
  EXPECT_EQ(opt->num_states(), 2);
  Tensor p = randn({5}, 1), pr = clone(p), m = zeros({5}), v = zeros({5});
  for (int t = 1; t <= 3; ++t) {
    Tensor g = randn({5}, 10 + static_cast<std::uint64_t>(t));
    opt->step(ctx, p, g, nullptr, 1e-2, 0.5);
    ops::AdamWStep a;
    a.lr = 1e-2;
    a.beta1 = c.beta1;
    a.beta2 = c.beta2;
    a.eps = c.eps;
    a.weight_decay = c.weight_decay;
    a.step = t;
    a.grad_scale = 0.5;
    ops::adamw(ctx, pr, g, m, v, a, nullptr);
  }
  EXPECT_EQ(values(p), values(pr));   // bitwise: the wrapper adds no arithmetic
}

TEST_F(OptimizerTest, FactoryNamesAndStates) {
  for (auto [name, states] : {std::pair{OptimizerName::adamw, 2}, {OptimizerName::sgd, 1}, {OptimizerName::lars, 1},
                               {OptimizerName::lamb, 2}}) {
    OptimConfig c;
    c.name = name;
    auto opt = optim::make_optimizer(c, 4, DType::f64, ctx, 1, {});
    EXPECT_EQ(opt->name(), name_of(name));
    EXPECT_EQ(opt->num_states(), states);
    EXPECT_EQ(opt->state_bytes(), static_cast<std::size_t>(states) * 4 * 8);
  }
  OptimConfig bad;
  bad.name = static_cast<OptimizerName>(99);   // no deck value parses to it
  EXPECT_THROW(optim::make_optimizer(bad, 4, DType::f64, ctx, 1, {}), UsageError);
}

// fp32 against the fp64 reference (the CPU path the trainer uses).
TEST_F(OptimizerTest, Fp32MatchesFp64) {
  const std::int64_t n = 8;
  for (OptimizerName name : {OptimizerName::sgd, OptimizerName::lars, OptimizerName::lamb}) {
    SCOPED_TRACE(to_string(name));
    OptimConfig c;
    c.name = name;
    c.weight_decay = 0.01;
    auto o64 = optim::make_optimizer(c, n, DType::f64, ctx, 2, two_params());
    auto o32 = optim::make_optimizer(c, n, DType::f32, ctx, 2, two_params());
    Tensor p64 = randn({n}, 3), p32 = as(p64, DType::f32);
    for (int t = 1; t <= 3; ++t) {
      Tensor g = randn({n}, 50 + static_cast<std::uint64_t>(t)), g32 = as(g, DType::f32);
      o64->step(ctx, p64, g, nullptr, 0.01, 1.0);
      o32->step(ctx, p32, g32, nullptr, 0.01, 1.0);
    }
    expect_near(values(p32), values(p64), 1e-6, "fp32 vs fp64");
  }
}

}  // namespace
}  // namespace lmscale::test
