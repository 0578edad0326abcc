// Hopper's FP8 fast accumulation on CUDA (precision.fp8_fast_accum; docs/precision.md, "Error
// bounds"): ops::linear_fp8 with Fp8Accumulation::fast against the fp64 product of the same fp8
// operands within the documented bound, the promoted (default) product within the promoted one;
// the flag reaching cuBLASLt (the fast and the promoted products differ, and make two plans);
// fast_accum refused on a product that is not FP8; and ops::Fp8Linear running each product with
// the accumulation its options ask for, bitwise (forward, the recompute's replay, dx, dW).
// Skipped (exit 77) without a GPU; each test skips itself without FP8 tensor cores.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../../src/ops/cuda/gemm.h"
#include "../../src/ops/cuda/resources.h"
#include "lmscale/core/fp8.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_linear.h"
#include "lmscale/ops/fp8_scaling.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

using ops::Fp8Accumulation;

// The bounds of docs/precision.md ("Error bounds"), per output element, in units of
// sum_k |a_k b_k| (the operands as decoded, scales applied):
// promoted: 2^-9, empirical (1.95x the worst an H100 measured: 1.0e-3 at 128 x 96 x 512, same signs);
constexpr double kPromoted = 1.0 / 512;
// fast: (ceil(K/32) + 1) 2^-10: each tensor-core instruction (32 products of FP8) errs by at most 8
// units of 2^-13 (a 14-bit accumulator, DeepSeek-V3 §3.3.2) of the magnitudes it adds, and never
// promoting lets K/32 of them add up. Empirical too: an H100 erred by 4.5-4.8 such units per
// instruction on same-sign data at K = 1024 and 4096 (0.0183 and 0.0762 of sum |a b|).
double fast_bound(std::int64_t K) { return static_cast<double>((K + 31) / 32 + 1) / 1024; }
// fp32 output: one rounding of the result.
constexpr double kOutRounding = 1.0 / (1 << 23);

class Fp8FastAccumCuda : public CudaOpsTest {
 protected:
  // Host fp8 codes of normal(0, 1) values times 2^exp (same_sign: their absolute values, so every
  // product is positive and the partial sums grow with k: the accumulation's worst case).
  Tensor codes(const Shape& s, DType t, int exp, bool same_sign) {
    Tensor h = Tensor::empty(s, t, cpu_.host(), "test_host");
    const auto v = randn(static_cast<std::size_t>(h.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double x = std::ldexp(same_sign ? std::fabs(v[i]) : v[i], exp);
      h.data_as<std::uint8_t>()[i] = float_to_fp8(static_cast<float>(x), fp8_format(t));
    }
    return h;
  }
  // The same codes with the sign bit cleared (|value|; bit 7 in both formats).
  Tensor magnitudes(const Tensor& h) {
    Tensor m = Tensor::empty(h.shape(), h.dtype(), cpu_.host(), "test_host");
    for (std::int64_t i = 0; i < h.numel(); ++i) m.data_as<std::uint8_t>()[i] = h.data_as<std::uint8_t>()[i] & 0x7F;
    return m;
  }
  Tensor to_device(const Tensor& h) {
    Tensor d = Tensor::empty(h.shape(), h.dtype(), gpu_.allocator(), "test_dev");
    ops::copy(g(), h, d);
    return d;
  }
  Tensor scalar(float v, bool device) {
    Tensor h = Tensor::empty({1}, DType::f32, cpu_.host(), "test_host");
    *h.data_as<float>() = v;
    return device ? to_device(h) : h;
  }
  std::vector<std::uint8_t> bytes(const Tensor& t) {
    Tensor h = Tensor::empty(t.shape(), t.dtype(), cpu_.host(), "test_host");
    ops::copy(g(), t, h);
    const auto* p = static_cast<const std::uint8_t*>(h.data());
    return {p, p + h.nbytes()};
  }
};

// The worst |got - ref| / sum|a b| over the elements, failing (up to 5 reports) those above
// bound * sum|a b| + kOutRounding * |ref|.
double check_within(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                    const std::vector<double>& abs_ref, double bound, std::uint64_t seed) {
  double worst = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    if (abs_ref[i] > 0) worst = std::max(worst, err / abs_ref[i]);
    if (!(err <= bound * abs_ref[i] + kOutRounding * std::fabs(ref[i])) && ++bad <= 5)
      ADD_FAILURE() << what << " element " << i << ": gpu " << got[i] << ", reference " << ref[i] << ", |error| "
                    << err << " > " << bound << " sum|a b| = " << bound * abs_ref[i] << " (seed " << seed << ")";
  }
  EXPECT_EQ(bad, 0u) << what << ": of " << got.size();
  return worst;
}

TEST_F(Fp8FastAccumCuda, LinearFp8WithinTheDocumentedBounds) {
  if (!has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores (compute capability < 8.9)";
  struct Shape3 {
    std::int64_t M, N, K;
  };
  const Shape3 shapes[] = {{64, 48, 32}, {128, 96, 512}, {96, 128, 1024}, {64, 256, 4096}};
  // The forward's e4m3 x e4m3, and the gradients' e5m2 dy against e4m3 (precision.fp8_fast_accum = all).
  const std::pair<DType, DType> types[] = {{DType::e4m3, DType::e4m3}, {DType::e5m2, DType::e4m3}};
  bool fast_differs = false;   // at some K >= 1024: the flag reached cuBLASLt
  for (const Shape3& s : shapes)
    for (const auto& [ta, tb] : types)
      for (const bool same_sign : {false, true}) {
        SCOPED_TRACE(::testing::Message() << s.M << "x" << s.N << "x" << s.K << " " << dtype_name(ta) << " x "
                                          << dtype_name(tb) << (same_sign ? " same sign" : " random signs"));
        // Values around 2^5 (e4m3, largest 448) and 2^10 (e5m2): normal numbers, none saturating.
        const Tensor ah = codes({s.M, s.K}, ta, ta == DType::e4m3 ? 5 : 10, same_sign);
        const Tensor bh = codes({s.N, s.K}, tb, 5, same_sign);
        const float a_inv = ta == DType::e4m3 ? 1.f / 32 : 1.f / 1024, b_inv = 1.f / 32;
        Tensor yh = Tensor::empty({s.M, s.N}, DType::f64, cpu_.host(), "test_host");
        Tensor abs_h = Tensor::empty({s.M, s.N}, DType::f64, cpu_.host(), "test_host");
        ops::linear_fp8(c(), ah, scalar(a_inv, false), bh, scalar(b_inv, false), yh, false);
        ops::linear_fp8(c(), magnitudes(ah), scalar(a_inv, false), magnitudes(bh), scalar(b_inv, false), abs_h, false);
        const Tensor ad = to_device(ah), bd = to_device(bh), ai = scalar(a_inv, true), bi = scalar(b_inv, true);
        Tensor yf = poisoned({s.M, s.N}, DType::f32), yp = poisoned({s.M, s.N}, DType::f32);
        ops::linear_fp8(g(), ad, ai, bd, bi, yf, false, Fp8Accumulation::fast);
        ops::linear_fp8(g(), ad, ai, bd, bi, yp, false, Fp8Accumulation::promoted);
        const auto ref = values(yh), abs_ref = values(abs_h), fast = values(yf), promoted = values(yp);
        const double worst_fast = check_within("fast", fast, ref, abs_ref, fast_bound(s.K), seed());
        const double worst_promoted = check_within("promoted", promoted, ref, abs_ref, kPromoted, seed());
        if (s.K >= 1024 && fast != promoted) fast_differs = true;
        std::printf("%4lldx%4lldx%4lld %s x %s %-12s worst |error| / sum|a b|: fast %.3g (bound %.3g), promoted "
                    "%.3g (bound %.3g)\n",
                    static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                    dtype_name(ta), dtype_name(tb), same_sign ? "same sign" : "random signs", worst_fast,
                    fast_bound(s.K), worst_promoted, kPromoted);
      }
  EXPECT_TRUE(fast_differs) << "Fp8Accumulation::fast gave the promoted product's bits at every K >= 1024: the "
                               "flag did not reach cuBLASLt (CUBLASLT_MATMUL_DESC_FAST_ACCUM)";
}

TEST_F(Fp8FastAccumCuda, FastAndPromotedMakeTwoPlansAndOnlyFp8TakesIt) {
  if (!has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores (compute capability < 8.9)";
  auto& cache = ops::cuda::resources(g()).gemm_plans;
  const std::int64_t M = 80, N = 112, K = 208;   // a shape no other test makes
  const Tensor a = to_device(codes({M, K}, DType::e4m3, 5, false)), b = to_device(codes({N, K}, DType::e4m3, 5, false));
  const Tensor one = scalar(1.f, true);
  Tensor y = poisoned({M, N}, DType::f32);
  const std::int64_t plans0 = cache.plans_made;
  ops::linear_fp8(g(), a, one, b, one, y, false, Fp8Accumulation::promoted);
  ops::linear_fp8(g(), a, one, b, one, y, false, Fp8Accumulation::fast);
  EXPECT_EQ(cache.plans_made - plans0, 2) << "a fast and a promoted product must not share a plan";
  ops::linear_fp8(g(), a, one, b, one, y, false, Fp8Accumulation::promoted);
  ops::linear_fp8(g(), a, one, b, one, y, false, Fp8Accumulation::fast);
  EXPECT_EQ(cache.plans_made - plans0, 2) << "each found its own plan again";
  // A bf16 product asking for fast accumulation is refused before cuBLASLt sees it.
  const Tensor x = dev(randn(16 * 32, DType::bf16), {16, 32}, DType::bf16);
  Tensor out = poisoned({16, 16}, DType::bf16);
  ops::cuda::GemmArgs args;
  args.trans_a = true;
  args.m = 16, args.n = 16, args.k = 32;
  args.a = x.data(), args.lda = 32;
  args.b = x.data(), args.ldb = 32;
  args.c = out.data(), args.ldc = 16;
  args.ab_type = DType::bf16, args.c_type = DType::bf16;
  args.fast_accum = true;
  EXPECT_THROW(ops::cuda::gemm(ops::cuda::resources(g()), false, args), std::exception);
  args.fast_accum = false;
  EXPECT_NO_THROW(ops::cuda::gemm(ops::cuda::resources(g()), false, args));
}

// Fp8Linear under each precision.fp8_fast_accum setting: its forward, its replay (a recompute)
// and its dx and dW are bitwise linear_fp8 on the same operands with the accumulation the
// setting gives that product. Same-sign data at K = 2048 makes the fast and promoted products
// differ (checked), so a product run with the other accumulation would fail.
TEST_F(Fp8FastAccumCuda, Fp8LinearRunsEachProductAsItsOptionsSay) {
  if (!has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores (compute capability < 8.9)";
  const std::int64_t M = 2048, K = 2048, N = 2048;
  auto positive = [&](std::int64_t n, double scale) {
    auto v = randn(static_cast<std::size_t>(n), DType::bf16, scale);
    for (double& e : v) e = std::fabs(e);
    return v;
  };
  const Tensor x = dev(positive(M * K, 1.0), {M, K}, DType::bf16), w = dev(positive(N * K, 0.04), {N, K}, DType::bf16),
               dy = dev(positive(M * N, 1e-3), {M, N}, DType::bf16);
  auto transposed = [&](const Tensor& q) {
    Tensor t = Tensor::empty({q.dim(1), q.dim(0)}, q.dtype(), gpu_.allocator(), "test_dev");
    ops::transpose_fp8(g(), q, t);
    return t;
  };
  // dy quantised as the layer's backward does (current scaling: the same codes and inverse scale).
  ops::Fp8TensorScaling dys(g(), Fp8Format::e5m2, ops::Fp8Recipe::current, 1, 0);
  Tensor dyq = Tensor::empty({M, N}, DType::e5m2, gpu_.allocator(), "test_dev");
  dys.quantize(g(), dy, dyq);
  const Tensor dyqt = transposed(dyq);
  const std::pair<const char*, std::pair<Fp8Accumulation, Fp8Accumulation>> settings[] = {
      {"none", {Fp8Accumulation::promoted, Fp8Accumulation::promoted}},
      {"forward", {Fp8Accumulation::fast, Fp8Accumulation::promoted}},
      {"all", {Fp8Accumulation::fast, Fp8Accumulation::fast}}};
  for (const auto& [name, acc] : settings) {
    SCOPED_TRACE(name);
    ops::Fp8LinearOptions o;
    o.forward_accumulation = acc.first;
    o.grad_accumulation = acc.second;
    ops::Fp8Linear lin(g(), o);
    Tensor y = poisoned({M, N}, DType::f32), y_replay = poisoned({M, N}, DType::f32);
    Tensor dx = poisoned({M, K}, DType::f32), dw = poisoned({N, K}, DType::f32);
    const ops::Fp8LinearSaved saved = lin.forward(g(), x, w, y);
    lin.replay(g(), saved.scales, x, w, &y_replay);
    lin.backward(g(), saved, dy, &dx, &dw, false);
    // The same products by hand, each with either accumulation.
    const Tensor xq = transposed(saved.xt_q), wq = transposed(saved.wt_q);
    for (const Fp8Accumulation a : {Fp8Accumulation::promoted, Fp8Accumulation::fast}) {
      const bool fwd = a == acc.first, grad = a == acc.second;
      Tensor y_ref = poisoned({M, N}, DType::f32), dx_ref = poisoned({M, K}, DType::f32),
             dw_ref = poisoned({N, K}, DType::f32);
      ops::linear_fp8(g(), xq, saved.x_inv(), wq, saved.w_inv(), y_ref, false, a);
      ops::linear_fp8(g(), dyq, dys.inv_scale(), saved.wt_q, saved.w_inv(), dx_ref, false, a);
      ops::linear_fp8(g(), dyqt, dys.inv_scale(), saved.xt_q, saved.x_inv(), dw_ref, false, a);
      EXPECT_EQ(bytes(y) == bytes(y_ref), fwd) << "forward against the " << (fwd ? "" : "other ") << "accumulation";
      EXPECT_EQ(bytes(y_replay) == bytes(y_ref), fwd) << "replay";
      EXPECT_EQ(bytes(dx) == bytes(dx_ref), grad) << "dx";
      EXPECT_EQ(bytes(dw) == bytes(dw_ref), grad) << "dW";
    }
  }
}

}  // namespace
}  // namespace lmscale::test
