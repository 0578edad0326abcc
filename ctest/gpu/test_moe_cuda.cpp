// The mixture-of-experts ops on CUDA (src/ops/cuda/moe_*.cu) against the CPU implementation on
// random inputs, with exact ties and capacity drops. Integer outputs (experts, slot, kept, routed)
// must be identical; the first differing entries are printed. Float bounds (relative, whole tensor,
// test::rel_error): the router (probs, lse, gates, terms, dlogits) runs in fp64 on both devices and
// rounds once to fp32: 1e-6; the row movers in fp32: moe_gather bitwise (a copy), moe_gather_backward
// bitwise in fp32 (same j order), combine and its backward 1e-5 (the GPU contracts to FMA, the CPU
// dot is fp64); bf16 activations against the fp32 CPU on the same rounded inputs: 1e-2.
#include <algorithm>
#include <sstream>
#include <tuple>

#include "../../src/ops/cuda/gemm_grouped.h"
#include "../../src/ops/cuda/grouped_gemm_sm90.h"
#include "../../src/ops/cuda/resources.h"
#include "lmscale/core/error.h"
#include "lmscale/ops/moe.h"
#include "lmscale/ops/moe_experts.h"
#include "ops_cuda_test_util.h"

using namespace lmscale;

namespace {

class MoeCuda : public test::CudaOpsTest {
 protected:
  // The first few entries where the integer tensors differ, or "" when equal.
  static std::string int_diff(const std::vector<double>& got, const std::vector<double>& want) {
    if (got.size() != want.size()) return "sizes differ";
    std::ostringstream os;
    int shown = 0;
    for (std::size_t i = 0; i < got.size() && shown < 8; ++i)
      if (got[i] != want[i]) {
        os << " [" << i << "] gpu " << got[i] << " cpu " << want[i];
        ++shown;
      }
    return os.str();
  }
  void expect_same_ints(const Tensor& gpu, const Tensor& cpu, const char* what) {
    EXPECT_EQ(int_diff(values(gpu), values(cpu)), "") << what << " differs (seed " << seed() << ")";
  }
  Tensor cpu_empty(const Shape& s, DType t) { return Tensor::empty(s, t, cpu_.host(), "test_host"); }

  // Logits [N,E] with exact ties: every 5th row all equal, every 5th + 1 row in equal pairs.
  std::vector<double> tied_logits(std::int64_t N, std::int64_t E, DType t) {
    std::vector<double> z = randn(static_cast<std::size_t>(N * E), t, 2.0);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t e = 0; e < E; ++e) {
        auto& v = z[static_cast<std::size_t>(n * E + e)];
        if (n % 5 == 0) v = 0.5;
        if (n % 5 == 1 && (e & 1)) v = z[static_cast<std::size_t>(n * E + (e ^ 1))];
      }
    return z;
  }

  // Expert choices [N,k] (distinct per row), skewed toward expert 0 when `skew` (forces drops).
  std::vector<std::int32_t> choices(std::int64_t N, std::int64_t k, std::int64_t E, bool skew) {
    std::vector<std::int32_t> ex(static_cast<std::size_t>(N * k));
    for (std::int64_t n = 0; n < N; ++n) {
      std::vector<std::int32_t> perm(static_cast<std::size_t>(E));
      for (std::int64_t e = 0; e < E; ++e) perm[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(e);
      const auto r = randint(static_cast<std::size_t>(E), 0, 1 << 30);
      for (std::int64_t e = E - 1; e > 0; --e)   // Fisher-Yates
        std::swap(perm[static_cast<std::size_t>(e)],
                  perm[static_cast<std::size_t>(r[static_cast<std::size_t>(e)] % (e + 1))]);
      if (skew && randint(1, 0, 4)[0] != 0) std::swap(perm[0], *std::find(perm.begin(), perm.end(), 0));
      for (std::int64_t j = 0; j < k; ++j) ex[static_cast<std::size_t>(n * k + j)] = perm[static_cast<std::size_t>(j)];
    }
    return ex;
  }

  // A CPU plan: slot [N,k] as a host tensor and M.
  Tensor cpu_plan(const std::vector<std::int32_t>& ex, std::int64_t N, std::int64_t k, std::int64_t E,
                  std::int64_t group, std::int64_t capacity, std::int64_t& M) {
    Tensor slot = cpu_empty({N, k}, DType::i32), kept = cpu_empty({E}, DType::i32), routed = cpu_empty({E}, DType::i32);
    ops::moe_plan(c(), host_ids(ex, {N, k}), group, capacity, slot, kept, routed);
    M = 0;
    for (std::int64_t e = 0; e < E; ++e) M += kept.data_as<std::int32_t>()[e];
    return slot;
  }
};

TEST_F(MoeCuda, RouteMatchesCpuWithTies) {
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t E : {4, 8, 40, 64})
      for (std::int64_t k : {1, 2, 3}) {
        if (k > E) continue;
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " E " << E << " k " << k);
        const std::int64_t N = 203;
        const auto z = tied_logits(N, E, t);
        Tensor probs = poisoned({N, E}, DType::f32), lse = poisoned({N}, DType::f32);
        Tensor experts = poisoned({N, k}, DType::i32), gates = poisoned({N, k}, DType::f32);
        ops::moe_route(g(), dev(z, {N, E}, t), probs, lse, experts, gates);
        Tensor cp = cpu_empty({N, E}, DType::f32), cl = cpu_empty({N}, DType::f32);
        Tensor ce = cpu_empty({N, k}, DType::i32), cg = cpu_empty({N, k}, DType::f32);
        ops::moe_route(c(), host(z, {N, E}, DType::f32), cp, cl, ce, cg);
        expect_same_ints(experts, ce, "experts");
        EXPECT_CLOSE(values(probs), values(cp), 1e-6);
        EXPECT_CLOSE(values(lse), values(cl), 1e-6);
        EXPECT_CLOSE(values(gates), values(cg), 1e-6);
      }
}

TEST_F(MoeCuda, PlanMatchesCpuWithDrops) {
  for (std::int64_t E : {4, 40, 1024})
    for (std::int64_t k : {1, 2})
      for (std::int64_t group : {1, 7, 300, 1000})
        for (bool skew : {false, true}) {
          const std::int64_t N = group * 3;
          const auto ex = choices(N, k, E, skew);
          for (std::int64_t capacity : {std::int64_t{0}, std::int64_t{1}, (group * k + E - 1) / E, group * k}) {
            SCOPED_TRACE(testing::Message() << "E " << E << " k " << k << " group " << group << " skew " << skew
                                            << " capacity " << capacity);
            Tensor slot = poisoned({N, k}, DType::i32), kept = poisoned({E}, DType::i32);
            Tensor routed = poisoned({E}, DType::i32);
            ops::moe_plan(g(), dev_ids(ex, {N, k}), group, capacity, slot, kept, routed);
            Tensor cs = cpu_empty({N, k}, DType::i32), ck = cpu_empty({E}, DType::i32), cr = cpu_empty({E}, DType::i32);
            ops::moe_plan(c(), host_ids(ex, {N, k}), group, capacity, cs, ck, cr);
            expect_same_ints(slot, cs, "slot");
            expect_same_ints(kept, ck, "kept");
            expect_same_ints(routed, cr, "routed");
          }
        }
}

TEST_F(MoeCuda, GatherAndItsBackwardMatchCpu) {
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t d : {64, 33, 1})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " d " << d << " accumulate " << accumulate);
        const std::int64_t N = 150, k = 2, E = 6, T = 50;
        std::int64_t M = 0;
        const auto ex = choices(N, k, E, true);
        const Tensor slot_h = cpu_plan(ex, N, k, E, T, 12, M);   // skewed: drops, some tokens lose both
        std::vector<std::int32_t> sl(static_cast<std::size_t>(N * k));
        std::copy_n(slot_h.data_as<std::int32_t>(), N * k, sl.begin());
        const Tensor slot = dev_ids(sl, {N, k});
        const auto x = randn(static_cast<std::size_t>(N * d), t);
        Tensor xe = poisoned({M, d}, t);
        ops::moe_gather(g(), dev(x, {N, d}, t), slot, xe);
        Tensor cxe = cpu_empty({M, d}, t);
        ops::moe_gather(c(), host(x, {N, d}, t), slot_h, cxe);
        EXPECT_EQ(values(xe), values(cxe)) << "moe_gather is a copy (seed " << seed() << ")";

        const auto dxe = randn(static_cast<std::size_t>(M * d), t);
        const auto dx0 = randn(static_cast<std::size_t>(N * d), t);
        Tensor dx = accumulate ? dev(dx0, {N, d}, t) : poisoned({N, d}, t);
        ops::moe_gather_backward(g(), dev(dxe, {M, d}, t), slot, dx, accumulate);
        Tensor cdx = host(dx0, {N, d}, DType::f32);
        ops::moe_gather_backward(c(), host(dxe, {M, d}, DType::f32), slot_h, cdx, accumulate);
        if (t == DType::f32)
          EXPECT_EQ(values(dx), values(cdx)) << "fp32 sums in the same order (seed " << seed() << ")";
        else
          EXPECT_CLOSE(values(dx), values(cdx), test::tolerance(t));
      }
}

TEST_F(MoeCuda, CombineAndItsBackwardMatchCpu) {
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t d : {64, 33}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " d " << d);
      const std::int64_t N = 150, k = 2, E = 6, T = 50;
      std::int64_t M = 0;
      const auto ex = choices(N, k, E, true);
      const Tensor slot_h = cpu_plan(ex, N, k, E, T, 12, M);
      std::vector<std::int32_t> sl(static_cast<std::size_t>(N * k));
      std::copy_n(slot_h.data_as<std::int32_t>(), N * k, sl.begin());
      const Tensor slot = dev_ids(sl, {N, k});
      const auto ye = randn(static_cast<std::size_t>(M * d), t), dout = randn(static_cast<std::size_t>(N * d), t);
      const auto gates = randn(static_cast<std::size_t>(N * k), DType::f32);
      const double tol = t == DType::f32 ? 1e-5 : test::tolerance(t);
      Tensor out = poisoned({N, d}, t);
      ops::moe_combine(g(), dev(ye, {M, d}, t), slot, dev(gates, {N, k}, DType::f32), out);
      Tensor cout_ = cpu_empty({N, d}, DType::f32);
      ops::moe_combine(c(), host(ye, {M, d}, DType::f32), slot_h, host(gates, {N, k}, DType::f32), cout_);
      EXPECT_CLOSE(values(out), values(cout_), tol);

      Tensor dye = poisoned({M, d}, t), dgates = poisoned({N, k}, DType::f32);
      ops::moe_combine_backward(g(), dev(dout, {N, d}, t), dev(ye, {M, d}, t), slot, dev(gates, {N, k}, DType::f32),
                                dye, dgates);
      Tensor cdye = cpu_empty({M, d}, DType::f32), cdg = cpu_empty({N, k}, DType::f32);
      ops::moe_combine_backward(c(), host(dout, {N, d}, DType::f32), host(ye, {M, d}, DType::f32), slot_h,
                                host(gates, {N, k}, DType::f32), cdye, cdg);
      EXPECT_CLOSE(values(dye), values(cdye), tol);
      EXPECT_CLOSE(values(dgates), values(cdg), tol);
    }
}

// The experts on the GPU (8, one without rows) against the CPU: forward,
// and the backward with fresh and accumulated gradients (fp32 gradients of bf16 activations, as
// under mixed precision); expert 5 has no rows (zero gradients, or unchanged ones when
// accumulating). Bounds as the linear ops': 1e-5 in fp32, test::tolerance in bf16.
TEST_F(MoeCuda, ExpertsMatchCpu) {
  const std::vector<std::int64_t> rows = {37, 64, 5, 130, 1, 0, 90, 17};
  const std::int64_t El = 8, Me = 344, d = 64, Fe = 96;
  for (DType t : {DType::f32, DType::bf16})
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " accumulate " << accumulate);
      const auto x = randn(static_cast<std::size_t>(Me * d), t), dy = randn(static_cast<std::size_t>(Me * d), t);
      const auto w1 = randn(static_cast<std::size_t>(El * Fe * d), t, 0.2), w3 = randn(w1.size(), t, 0.2);
      const auto w2 = randn(static_cast<std::size_t>(El * d * Fe), t, 0.2);
      const auto g0 = randn(w1.size(), DType::f32);
      const Shape sx{Me, d}, sf{Me, Fe}, s13{El, Fe, d}, s2{El, d, Fe};
      const Tensor X = dev(x, sx, t), W1 = dev(w1, s13, t), W3 = dev(w3, s13, t), W2 = dev(w2, s2, t);
      Tensor a = poisoned(sf, t), b = poisoned(sf, t), gg = poisoned(sf, t), y = poisoned(sx, t);
      ops::moe_experts(g(), X, rows, W1, W3, W2, a, b, gg, y);
      const Tensor cX = host(x, sx, DType::f32), cW1 = host(w1, s13, DType::f32), cW3 = host(w3, s13, DType::f32);
      const Tensor cW2 = host(w2, s2, DType::f32);
      Tensor ca = cpu_empty(sf, DType::f32), cb = cpu_empty(sf, DType::f32), cg = cpu_empty(sf, DType::f32);
      Tensor cy = cpu_empty(sx, DType::f32);
      ops::moe_experts(c(), cX, rows, cW1, cW3, cW2, ca, cb, cg, cy);
      const double tol = test::tolerance(t);
      EXPECT_CLOSE(values(y), values(cy), tol);
      EXPECT_CLOSE(values(gg), values(cg), tol);

      Tensor dg = poisoned(sf, t), da = poisoned(sf, t), db = poisoned(sf, t), dx = poisoned(sx, t);
      auto grad = [&](const Shape& s) { return accumulate ? dev(g0, s, DType::f32) : poisoned(s, DType::f32); };
      Tensor G1 = grad(s13), G3 = grad(s13), G2 = grad(s2);
      ops::moe_experts_backward(g(), X, rows, W1, W3, W2, a, b, gg, dev(dy, sx, t), dg, da, db, dx, G1, G3, G2,
                                accumulate);
      // The CPU from the GPU's own forward activations, so the backward alone is compared.
      const Tensor ha = host(values(a), sf, DType::f32), hb = host(values(b), sf, DType::f32);
      const Tensor hg = host(values(gg), sf, DType::f32);
      Tensor cdg = cpu_empty(sf, DType::f32), cda = cpu_empty(sf, DType::f32), cdb = cpu_empty(sf, DType::f32);
      Tensor cdx = cpu_empty(sx, DType::f32);
      Tensor cG1 = host(g0, s13, DType::f32), cG3 = host(g0, s13, DType::f32), cG2 = host(g0, s2, DType::f32);
      ops::moe_experts_backward(c(), cX, rows, cW1, cW3, cW2, ha, hb, hg, host(dy, sx, DType::f32), cdg, cda, cdb,
                                cdx, cG1, cG3, cG2, accumulate);
      EXPECT_CLOSE(values(dx), values(cdx), tol);
      EXPECT_CLOSE(values(G1), values(cG1), tol);
      EXPECT_CLOSE(values(G3), values(cG3), tol);
      EXPECT_CLOSE(values(G2), values(cG2), tol);
      const auto g1 = values(G1);   // expert 5: no rows
      for (std::int64_t i = 5 * Fe * d; i < 6 * Fe * d; ++i)
        ASSERT_EQ(g1[static_cast<std::size_t>(i)], accumulate ? g0[static_cast<std::size_t>(i)] : 0.0);
    }
}

TEST_F(MoeCuda, RouterLossesAndBackwardMatchCpu) {
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t E : {8, 40}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " E " << E);
      const std::int64_t T = 50, N = 4 * T, k = 2;
      const auto z = tied_logits(N, E, DType::f32);
      // The CPU route's outputs feed both devices' losses and backward.
      Tensor cp = cpu_empty({N, E}, DType::f32), cl = cpu_empty({N}, DType::f32);
      Tensor ce = cpu_empty({N, k}, DType::i32), cg = cpu_empty({N, k}, DType::f32);
      ops::moe_route(c(), host(z, {N, E}, DType::f32), cp, cl, ce, cg);
      const auto p = values(cp), l = values(cl), gt = values(cg);
      std::vector<std::int32_t> ex(static_cast<std::size_t>(N * k));
      std::copy_n(ce.data_as<std::int32_t>(), N * k, ex.begin());
      const Tensor probs = dev(p, {N, E}, DType::f32), lse = dev(l, {N}, DType::f32);
      const Tensor gates = dev(gt, {N, k}, DType::f32);
      const Tensor experts = dev_ids(ex, {N, k});

      Tensor terms = poisoned({3}, DType::f32), cterms = cpu_empty({3}, DType::f32);
      ops::moe_router_losses(g(), probs, lse, experts, T, 0.01, 0.001, terms);
      ops::moe_router_losses(c(), cp, cl, ce, T, 0.01, 0.001, cterms);
      EXPECT_CLOSE(values(terms), values(cterms), 1e-6);

      const auto dg = randn(static_cast<std::size_t>(N * k), DType::f32);
      Tensor dlogits = poisoned({N, E}, t), cdl = cpu_empty({N, E}, DType::f32);
      ops::moe_route_backward(g(), probs, lse, experts, gates, dev(dg, {N, k}, DType::f32), T, 0.3, 0.2, 0.7, dlogits);
      ops::moe_route_backward(c(), cp, cl, ce, cg, host(dg, {N, k}, DType::f32), T, 0.3, 0.2, 0.7, cdl);
      EXPECT_CLOSE(values(dlogits), values(cdl), t == DType::f32 ? 1e-6 : test::tolerance(t));
    }
}

// The checks name the argument: statistics in the activations' dtype are refused for bf16.
TEST_F(MoeCuda, Bf16ActivationsNeedFp32Statistics) {
  const std::int64_t N = 8, E = 4, k = 2;
  Tensor probs = poisoned({N, E}, DType::bf16), lse = poisoned({N}, DType::f32);
  Tensor experts = poisoned({N, k}, DType::i32), gates = poisoned({N, k}, DType::f32);
  const Tensor logits = dev(randn(static_cast<std::size_t>(N * E)), {N, E}, DType::bf16);
  EXPECT_THROW(ops::moe_route(g(), logits, probs, lse, experts, gates), lmscale::Error);
}

// The experts' products of one form (loop or grouped) on the GPU: forward from X, backward from
// the given forward activations (so both forms differentiate the same a, b, g).
struct ExpertsOut {
  std::vector<double> a, b, g, y, dg, dx, G1, G3, G2;
};

class MoeGroupedCuda : public MoeCuda {
 protected:
  struct Inputs {
    std::vector<std::int64_t> rows;
    std::int64_t El = 0, Me = 0, d = 0, Fe = 0;
    DType t = DType::f32, gt = DType::f32;   // activations, weight gradients
    std::vector<double> x, w1, w3, w2, dy, g0;
  };
  Inputs inputs(const std::vector<std::int64_t>& rows, std::int64_t d, std::int64_t Fe, DType t, DType gt) {
    Inputs in{rows, static_cast<std::int64_t>(rows.size()), 0, d, Fe, t, gt, {}, {}, {}, {}, {}, {}};
    for (std::int64_t r : rows) in.Me += r;
    in.x = randn(static_cast<std::size_t>(in.Me * d), t);
    in.dy = randn(in.x.size(), t);
    in.w1 = randn(static_cast<std::size_t>(in.El * Fe * d), t, 0.2);
    in.w3 = randn(in.w1.size(), t, 0.2);
    in.w2 = randn(in.w1.size(), t, 0.2);
    in.g0 = randn(in.w1.size(), gt);
    return in;
  }
  // Forward of `how`; its backward from `fwd`'s activations (or its own when null).
  ExpertsOut run(const Inputs& in, ops::ExpertGemm how, bool accumulate, const ExpertsOut* fwd) {
    const Shape sx{in.Me, in.d}, sf{in.Me, in.Fe}, s13{in.El, in.Fe, in.d}, s2{in.El, in.d, in.Fe};
    const DType t = in.t;
    const Tensor X = dev(in.x, sx, t), W1 = dev(in.w1, s13, t), W3 = dev(in.w3, s13, t), W2 = dev(in.w2, s2, t);
    Tensor a = poisoned(sf, t), b = poisoned(sf, t), g = poisoned(sf, t), y = poisoned(sx, t);
    ops::moe_experts(this->g(), X, in.rows, W1, W3, W2, a, b, g, y, how);
    ExpertsOut o{values(a), values(b), values(g), values(y), {}, {}, {}, {}, {}};
    if (fwd) a = dev(fwd->a, sf, t), b = dev(fwd->b, sf, t), g = dev(fwd->g, sf, t);
    Tensor dg = poisoned(sf, t), da = poisoned(sf, t), db = poisoned(sf, t), dx = poisoned(sx, t);
    auto grad = [&](const Shape& s) { return accumulate ? dev(in.g0, s, in.gt) : poisoned(s, in.gt); };
    Tensor G1 = grad(s13), G3 = grad(s13), G2 = grad(s2);
    ops::moe_experts_backward(this->g(), X, in.rows, W1, W3, W2, a, b, g, dev(in.dy, sx, t), dg, da, db, dx, G1, G3,
                              G2, accumulate, how);
    o.dg = values(dg), o.dx = values(dx), o.G1 = values(G1), o.G3 = values(G3), o.G2 = values(G2);
    return o;
  }
  // The float64 CPU loop on the same rounded inputs; its backward from `fwd`'s activations.
  ExpertsOut reference(const Inputs& in, bool accumulate, const ExpertsOut& fwd) {
    const Shape sx{in.Me, in.d}, sf{in.Me, in.Fe}, s13{in.El, in.Fe, in.d}, s2{in.El, in.d, in.Fe};
    const Tensor X = ref(in.x, sx), W1 = ref(in.w1, s13), W3 = ref(in.w3, s13), W2 = ref(in.w2, s2);
    Tensor a = cpu_empty(sf, DType::f64), b = cpu_empty(sf, DType::f64), g = cpu_empty(sf, DType::f64);
    Tensor y = cpu_empty(sx, DType::f64);
    ops::moe_experts(c(), X, in.rows, W1, W3, W2, a, b, g, y);
    ExpertsOut o{values(a), values(b), values(g), values(y), {}, {}, {}, {}, {}};
    Tensor dg = cpu_empty(sf, DType::f64), da = cpu_empty(sf, DType::f64), db = cpu_empty(sf, DType::f64);
    Tensor dx = cpu_empty(sx, DType::f64);
    auto grad = [&](const Shape& s) { return ref(accumulate ? in.g0 : std::vector<double>(in.g0.size(), 0.0), s); };
    Tensor G1 = grad(s13), G3 = grad(s13), G2 = grad(s2);
    ops::moe_experts_backward(c(), X, in.rows, W1, W3, W2, ref(fwd.a, sf), ref(fwd.b, sf), ref(fwd.g, sf),
                              ref(in.dy, sx), dg, da, db, dx, G1, G3, G2, accumulate);
    o.dg = values(dg), o.dx = values(dx), o.G1 = values(G1), o.G3 = values(G3), o.G2 = values(G2);
    return o;
  }
  void expect_close(const ExpertsOut& got, const ExpertsOut& want, double tol, const char* what) {
    SCOPED_TRACE(what);
    for (const auto& [name, gv, wv] : {std::tuple{"y", &got.y, &want.y}, {"g", &got.g, &want.g}, {"dg", &got.dg, &want.dg},
                                       {"dx", &got.dx, &want.dx}, {"G1", &got.G1, &want.G1}, {"G3", &got.G3, &want.G3},
                                       {"G2", &got.G2, &want.G2}}) {
      SCOPED_TRACE(name);
      EXPECT_CLOSE(*gv, *wv, tol);
    }
  }
  // A grouped form's results `got` against the float64 reference and the loop's (`loop`, whose
  // backward ran from got's a, b, g): the forward within `tol`, the backward within `gtol`, and
  // got's empty experts untouched.
  void expect_matches(const Inputs& in, bool accumulate, const ExpertsOut& got, const ExpertsOut& loop, double tol,
                      double gtol) {
    const ExpertsOut want = reference(in, accumulate, got);
    EXPECT_CLOSE(got.y, want.y, tol);
    EXPECT_CLOSE(got.g, want.g, tol);
    EXPECT_CLOSE(loop.y, got.y, tol);
    ExpertsOut back = want;
    back.y = got.y, back.g = got.g;   // compared above
    expect_close(got, back, gtol, "against the float64 reference");
    ExpertsOut loop_back = loop;
    loop_back.y = got.y, loop_back.g = got.g;
    expect_close(loop_back, got, gtol, "the loop against it");
    expect_empty_experts_untouched(in, got, accumulate);
  }
  // Empty experts: gradients exactly zero, or exactly the accumulated ones.
  void expect_empty_experts_untouched(const Inputs& in, const ExpertsOut& o, bool accumulate) {
    const std::int64_t per = in.Fe * in.d;
    for (std::int64_t e = 0; e < in.El; ++e) {
      if (in.rows[static_cast<std::size_t>(e)] != 0) continue;
      for (const auto* G : {&o.G1, &o.G3, &o.G2})
        for (std::int64_t i = e * per; i < (e + 1) * per; ++i)
          ASSERT_EQ((*G)[static_cast<std::size_t>(i)], accumulate ? in.g0[static_cast<std::size_t>(i)] : 0.0)
              << "expert " << e << " element " << i;
    }
  }
};

// Uneven experts, two of equal rows (one cuBLAS group), two empty; fp32 and bf16 activations;
// weight gradients in fp32 (bf16 activations: the mixed-precision master gradients, which cuBLAS
// cannot group: they loop) and in the activations' dtype (grouped); fresh and accumulated. Counts
// what ran: 2 grouped GEMMs forward, 3 backward (dg, dx twice), 2 more for grouped weight
// gradients, else 3 looped products per non-empty expert; the loop form runs no grouped GEMM.
TEST_F(MoeGroupedCuda, GroupedExpertsMatchTheLoopAndTheFloat64Reference) {
  const std::vector<std::int64_t> rows = {37, 37, 0, 130, 1, 0, 90, 17};
  const std::int64_t non_empty = 6;
  auto& counts = ops::cuda::resources(g()).grouped_gemm;
  for (DType t : {DType::f32, DType::bf16})
    for (DType gt : {DType::f32, DType::bf16}) {
      if (t == DType::f32 && gt == DType::bf16) continue;
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " gradients " << dtype_name(gt) << " accumulate "
                                        << accumulate);
        const Inputs in = inputs(rows, 64, 96, t, gt);
        const auto before = counts;
        const ExpertsOut grouped = run(in, ops::ExpertGemm::grouped, accumulate, nullptr);
        const bool grouped_wgrad = gt == t;
        EXPECT_EQ(counts.calls - before.calls, 5 + (grouped_wgrad ? 2 : 0));
        EXPECT_EQ(counts.looped_products - before.looped_products, grouped_wgrad ? 0 : 3 * non_empty);
        const auto mid = counts;
        const ExpertsOut loop = run(in, ops::ExpertGemm::loop, accumulate, &grouped);
        EXPECT_EQ(counts.calls, mid.calls) << "the loop ran grouped GEMMs";
        const double tol = test::tolerance(t), gtol = test::tolerance(t == DType::f32 ? DType::f32 : DType::bf16);
        expect_matches(in, accumulate, grouped, loop, tol, gtol);
        expect_empty_experts_untouched(in, loop, accumulate);
      }
    }
}

// Our grouped GEMM for Hopper (model.moe_expert_gemm = wgmma) against the float64 reference and
// the loop. 22 experts, 18 with rows (36 products of w1|w3 and 54 operand maps for their weight
// gradients, more than one launch holds: those calls split, counted), rows from 0 to 300 (partial and whole 128-row tiles, one row, none); d = 192 and Fe = 264 make
// partial 256-column tiles and a partial last k step of the data gradients' reduction over Fe.
// bf16 and fp16 activations, weight gradients fp32 or in their dtype, fresh and accumulated: 2
// calls forward and 4 backward each time. fp32 activations loop (no call).
TEST_F(MoeGroupedCuda, WgmmaExpertsMatchTheLoopAndTheFloat64Reference) {
  if (!ops::cuda::grouped_sm90::available()) GTEST_SKIP() << "not an sm_90 GPU (or not built for sm_90a)";
  const std::vector<std::int64_t> rows = {37, 0,  130, 1,  128, 129, 300, 0, 64, 17, 255,
                                         3,  0,  90,  8,  127, 256, 2,   0, 41, 72, 19};
  const auto& counts = ops::cuda::resources(g()).grouped_gemm;
  const std::int64_t& calls = counts.sm90_calls;
  for (DType t : {DType::bf16, DType::f16})
    for (DType gt : {DType::f32, t})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " gradients " << dtype_name(gt) << " accumulate "
                                        << accumulate);
        const Inputs in = inputs(rows, 192, 264, t, gt);
        const std::int64_t before = calls, launches_before = counts.sm90_launches;
        const ExpertsOut got = run(in, ops::ExpertGemm::wgmma, accumulate, nullptr);
        EXPECT_EQ(calls - before, 6);
        EXPECT_EQ(counts.sm90_launches - launches_before, 8) << "the w1|w3 calls did not split into 2 launches each";
        const ExpertsOut loop = run(in, ops::ExpertGemm::loop, accumulate, &got);
        expect_matches(in, accumulate, got, loop, test::tolerance(t), test::tolerance(t));
      }
  const Inputs in = inputs({5, 0, 9}, 64, 48, DType::f32, DType::f32);
  const std::int64_t before = calls;
  const ExpertsOut got = run(in, ops::ExpertGemm::wgmma, false, nullptr);
  EXPECT_EQ(calls, before) << "fp32 activations ran the grouped kernel";
  expect_close(got, reference(in, false, got), test::tolerance(DType::f32), "fp32 loop");
}

// The loop's products on two streams (ops/cuda/gemm_lanes.h, the default) give the bits of one
// stream: forward and backward, fresh and accumulated gradients, bf16 and fp32, uneven and empty
// experts.
TEST_F(MoeGroupedCuda, TwoGemmLanesGiveTheBitsOfOne) {
  const std::vector<std::int64_t> rows = {37, 0, 130, 1, 90, 17, 0, 64};
  int& lanes = ops::cuda::resources(g()).gemm_lanes;
  for (DType t : {DType::f32, DType::bf16})
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " accumulate " << accumulate);
      const Inputs in = inputs(rows, 64, 96, t, DType::f32);
      lanes = 1;
      const ExpertsOut one = run(in, ops::ExpertGemm::loop, accumulate, nullptr);
      lanes = 2;
      const ExpertsOut two = run(in, ops::ExpertGemm::loop, accumulate, nullptr);
      for (const auto& [name, a, b] : {std::tuple{"y", &one.y, &two.y}, {"g", &one.g, &two.g}, {"dg", &one.dg, &two.dg},
                                       {"dx", &one.dx, &two.dx}, {"G1", &one.G1, &two.G1}, {"G3", &one.G3, &two.G3},
                                       {"G2", &one.G2, &two.G2}})
        EXPECT_EQ(*a, *b) << name << " differs between one and two lanes";
    }
  EXPECT_NE(ops::cuda::resources(g()).side_lane.stream, nullptr) << "the second lane was never used";
}

// Rows whose start is not 16-byte aligned (bf16, d = 60: rows of 120 bytes) break cuBLAS's
// alignment rule for grouped 16-bit products: those lists loop (counted) and still match the
// reference. No rows at all: nothing runs, fresh gradients are zero.
TEST_F(MoeGroupedCuda, MisalignedRowsLoopAndNoRowsZeroTheGradients) {
  auto& counts = ops::cuda::resources(g()).grouped_gemm;
  {
    const Inputs in = inputs({3, 0, 5, 2}, 60, 40, DType::bf16, DType::bf16);
    const auto before = counts;
    const ExpertsOut got = run(in, ops::ExpertGemm::grouped, false, nullptr);
    EXPECT_GT(counts.looped_products - before.looped_products, 0) << "misaligned rows were grouped";
    const ExpertsOut want = reference(in, false, got);
    expect_close(got, want, test::tolerance(DType::bf16), "misaligned");
    expect_empty_experts_untouched(in, got, false);
  }
  for (bool accumulate : {false, true}) {
    const Inputs in = inputs({0, 0, 0}, 64, 32, DType::bf16, DType::f32);
    const auto before = counts;
    const ExpertsOut got = run(in, ops::ExpertGemm::grouped, accumulate, nullptr);
    EXPECT_EQ(counts.calls, before.calls);
    EXPECT_EQ(counts.looped_products, before.looped_products);
    expect_empty_experts_untouched(in, got, accumulate);
  }
}

// The plan cache's shapes-vary mode (ops/cuda/gemm.h), as the experts' loop sets it: row counts of
// one shape class make one plan (the class's, from the first miss) rather than 4 exact ones and
// then the class's; a fixed shape outside the scope still gets its exact plan.
TEST_F(MoeGroupedCuda, VaryingRowsMakeOneClassPlanFromTheFirstMiss) {
  auto& cache = ops::cuda::resources(g()).gemm_plans;
  const std::int64_t K = 192, N = 160;
  const DType t = DType::bf16;
  const auto w = randn(static_cast<std::size_t>(N * K), t, 0.1);
  const Tensor wd = dev(w, {N, K}, t);
  const std::int64_t plans0 = cache.plans_made, products0 = cache.class_products, fallbacks0 = cache.class_fallbacks;
  const std::vector<std::int64_t> Ms = {300, 333, 365, 400, 421, 450, 487, 512};   // one class: 512
  {
    const ops::cuda::GemmShapesVary vary(g());
    for (const std::int64_t M : Ms) {
      SCOPED_TRACE(testing::Message() << "M=" << M);
      ASSERT_EQ(ops::cuda::shape_class_dim(M), 512);
      const auto x = randn(static_cast<std::size_t>(M * K), t);
      Tensor y = poisoned({M, N}, t), yr = ref(std::vector<double>(static_cast<std::size_t>(M * N)), {M, N});
      ops::linear(g(), dev(x, {M, K}, t), wd, y);
      ops::linear(c(), ref(x, {M, K}), ref(w, {N, K}), yr);
      EXPECT_CLOSE(values(y), values(yr), test::tolerance(t));
    }
  }
  const std::int64_t fallbacks = cache.class_fallbacks - fallbacks0;
  EXPECT_EQ(cache.plans_made - plans0, 1 + fallbacks) << "plans beyond the class's one and its fallbacks";
  EXPECT_EQ(cache.class_products - products0, static_cast<std::int64_t>(Ms.size()) - fallbacks);
  EXPECT_LT(fallbacks, static_cast<std::int64_t>(Ms.size()) / 2) << "the class's algorithm fits few of its shapes";
  // Outside the scope: a new shape of a new class gets an exact plan, not a class plan.
  const std::int64_t M = 700, plans1 = cache.plans_made, products1 = cache.class_products;
  Tensor y = poisoned({M, N}, t);
  ops::linear(g(), dev(randn(static_cast<std::size_t>(M * K), t), {M, K}, t), wd, y);
  EXPECT_EQ(cache.plans_made - plans1, 1);
  EXPECT_EQ(cache.class_products, products1);
}

}  // namespace
