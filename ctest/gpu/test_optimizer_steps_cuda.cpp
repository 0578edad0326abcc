// Momentum SGD, LAMB and the trust-ratio norms on CUDA (ops/optimizer_steps.h) against the float64
// CPU reference on random inputs, with sizes that are and are not multiples of the vector width,
// views that are not 16-byte aligned (scalar path), the bf16/fp16 working copy, and span lists
// that cut the buffer anywhere; then SGD, LARS and LAMB whole steps (optim::Optimizer with
// excluded segments) on the GPU against the same steps on the CPU in float64.
#include <cuda_runtime.h>

#include <memory>

#include "lmscale/ops/optimizer_steps.h"
#include "lmscale/optim/optimizer.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

const std::int64_t kSizes[] = {1 << 16, 100003, 13, 8};

TEST_F(CudaOpsTest, MomentumUpdate) {
  for (std::int64_t n : kSizes)
    for (std::int64_t off : {0, 1})
      for (DType lowp : {DType::bf16, DType::f16, DType::f64 /* none */})
        for (bool nesterov : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " off=" << off << " nesterov=" << nesterov << " lowp "
                                            << (lowp == DType::f64 ? "none" : dtype_name(lowp)));
          const auto p = randn(static_cast<std::size_t>(n + off), DType::f32),
                     gr = randn(static_cast<std::size_t>(n + off), DType::f32, 3.0),
                     b = randn(static_cast<std::size_t>(n + off), DType::f32, 0.1);
          ops::MomentumStep s;
          s.momentum = 0.9, s.weight_decay = 0.01, s.grad_scale = 0.25, s.coeff = 0.7, s.step = 3e-3;
          s.nesterov = nesterov;
          Tensor pd = dev(p, {n + off}, DType::f32).flat_range(off, n);
          Tensor gd = dev(gr, {n + off}, DType::f32).flat_range(off, n);
          Tensor bd = dev(b, {n + off}, DType::f32).flat_range(off, n);
          Tensor low = lowp == DType::f64 ? Tensor() : poisoned({n + off}, lowp).flat_range(off, n);
          ops::momentum_update(g(), pd, gd, bd, s, lowp == DType::f64 ? nullptr : &low);
          Tensor pr = ref(p, {n + off}).flat_range(off, n), br = ref(b, {n + off}).flat_range(off, n);
          Tensor grr = ref(gr, {n + off}).flat_range(off, n);
          ops::momentum_update(c(), pr, grr, br, s, nullptr);
          EXPECT_CLOSE(values(pd), values(pr), 1e-5);
          EXPECT_CLOSE(values(bd), values(br), 1e-5);
          if (lowp != DType::f64) {
            auto want = values(pd);
            for (auto& x : want) x = round_to(x, lowp);
            EXPECT_EQ(values(low), want);
          }
        }
}

TEST_F(CudaOpsTest, LambMomentsUpdateAndNorms) {
  for (std::int64_t n : kSizes)
    for (std::int64_t off : {0, 1})
      for (DType lowp : {DType::bf16, DType::f64 /* none */}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " off=" << off);
        const std::size_t N = static_cast<std::size_t>(n + off);
        const auto p = randn(N, DType::f32), gr = randn(N, DType::f32, 2.0), m = randn(N, DType::f32, 0.1);
        auto v = randn(N, DType::f32, 0.1);
        for (auto& x : v) x = round_to(x * x, DType::f32);
        ops::LambStep s;
        s.beta1 = 0.9, s.beta2 = 0.95, s.eps = 1e-6, s.weight_decay = 0.02, s.grad_scale = 0.5, s.step = 7;
        s.lr_ratio = 2e-3;
        Tensor pd = dev(p, {n + off}, DType::f32).flat_range(off, n), gd = dev(gr, {n + off}, DType::f32).flat_range(off, n);
        Tensor md = dev(m, {n + off}, DType::f32).flat_range(off, n), vd = dev(v, {n + off}, DType::f32).flat_range(off, n);
        Tensor pr = ref(p, {n + off}).flat_range(off, n), grr = ref(gr, {n + off}).flat_range(off, n);
        Tensor mr = ref(m, {n + off}).flat_range(off, n), vr = ref(v, {n + off}).flat_range(off, n);
        ops::lamb_moments(g(), gd, md, vd, s);
        ops::lamb_moments(c(), grr, mr, vr, s);
        EXPECT_CLOSE(values(md), values(mr), 1e-5);
        EXPECT_CLOSE(values(vd), values(vr), 1e-5);
        // Spans cutting the buffer anywhere, one of them empty.
        std::vector<ops::Span> spans{{0, n / 3}, {n / 3, 0}, {n / 3, n - n / 3 - 1}, {n - 1, 1}};
        const auto nd = ops::lamb_norms(g(), pd, md, vd, s, spans), nr = ops::lamb_norms(c(), pr, mr, vr, s, spans);
        ASSERT_EQ(nd.size(), nr.size());
        // Slots per span: p.p, r.r, r.p. The fp32 partial sums err in proportion to the sum of the
        // terms' magnitudes: the sums themselves for the squares, and for the cross term (which
        // cancels) at most sqrt(p.p r.r) by Cauchy-Schwarz.
        for (std::size_t i = 0; i < nd.size(); ++i) {
          const double magnitude = i % 3 == 2 ? std::sqrt(nr[i - 2] * nr[i - 1]) : std::fabs(nr[i]);
          EXPECT_NEAR(nd[i], nr[i], 1e-5 * std::max(1.0, magnitude)) << "norm slot " << i;
        }
        Tensor low = lowp == DType::f64 ? Tensor() : poisoned({n + off}, lowp).flat_range(off, n);
        ops::lamb_update(g(), pd, md, vd, s, lowp == DType::f64 ? nullptr : &low);
        ops::lamb_update(c(), pr, mr, vr, s, nullptr);
        EXPECT_CLOSE(values(pd), values(pr), 1e-5);
        if (lowp != DType::f64) {
          auto want = values(pd);
          for (auto& x : want) x = round_to(x, lowp);
          EXPECT_EQ(values(low), want);
        }
        const auto ld = ops::lars_norms(g(), pd, gd, 0.5, spans), lr = ops::lars_norms(c(), pr, grr, 0.5, spans);
        for (std::size_t i = 0; i < ld.size(); ++i)
          EXPECT_NEAR(ld[i], lr[i], 1e-5 * std::max(1.0, std::fabs(lr[i]))) << "lars slot " << i;
      }
}

// The norms kernel is deterministic: the same inputs give the same bits.
TEST_F(CudaOpsTest, TrustNormsDeterministic) {
  const std::int64_t n = 1000003;
  const auto p = randn(static_cast<std::size_t>(n), DType::f32), gr = randn(static_cast<std::size_t>(n), DType::f32);
  Tensor pd = dev(p, {n}, DType::f32), gd = dev(gr, {n}, DType::f32);
  const std::vector<ops::Span> spans{{0, 500000}, {500000, n - 500000}};
  const auto a = ops::lars_norms(g(), pd, gd, 1.0, spans), b = ops::lars_norms(g(), pd, gd, 1.0, spans);
  EXPECT_EQ(a, b);
}

// Whole optimizer steps (three steps, a layer-wise parameter cut in two spans and an excluded one)
// on the GPU in fp32 against the CPU in fp64.
TEST_F(CudaOpsTest, OptimizerStepsMatchCpu) {
  const std::int64_t n = 4099;
  const std::vector<optim::ParamSegment> segs{{0, 3000, 0, true}, {3000, 1000, 1, true}, {4000, 99, 2, false}};
  for (OptimizerName name : {OptimizerName::sgd, OptimizerName::lars, OptimizerName::lamb}) {
    SCOPED_TRACE(to_string(name));
    OptimConfig cfg;
    cfg.name = name;
    cfg.weight_decay = 0.01;
    cfg.nesterov = name == OptimizerName::sgd;
    auto od = optim::make_optimizer(cfg, n, DType::f32, g(), 3, segs);
    auto oc = optim::make_optimizer(cfg, n, DType::f64, c(), 3, segs);
    const auto p = randn(static_cast<std::size_t>(n), DType::f32);
    Tensor pd = dev(p, {n}, DType::f32), pc = ref(p, {n});
    Tensor low = poisoned({n}, DType::bf16);
    for (int t = 0; t < 3; ++t) {
      const auto gr = randn(static_cast<std::size_t>(n), DType::f32);
      Tensor gd = dev(gr, {n}, DType::f32), gc = ref(gr, {n});
      od->step(g(), pd, gd, &low, 0.01, 0.5);
      oc->step(c(), pc, gc, nullptr, 0.01, 0.5);
    }
    EXPECT_CLOSE(values(pd), values(pc), 1e-5);
    auto want = values(pd);
    for (auto& x : want) x = round_to(x, DType::bf16);
    EXPECT_EQ(values(low), want);
  }
}

}  // namespace
}  // namespace lmscale::test
