// ops::adamw_host (the offloaded optimizer's AdamW): bitwise against a restatement of the CUDA
// kernel's compiled arithmetic and against the CPU reference ops::adamw, within a stated bound of
// the float64 reference, the bf16 rounding of the working copy, and its bandwidth against a
// STREAM-like triad on this host (printed).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "lmscale/core/dtype.h"
#include "lmscale/ops/host_adamw.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using ops::AdamWArithmetic;

ops::AdamWStep hyper(std::int64_t t) {
  ops::AdamWStep a;
  a.lr = 3e-3;
  a.weight_decay = 0.1;
  a.beta1 = 0.9;
  a.beta2 = 0.95;
  a.eps = 1e-8;
  a.grad_scale = 0.37;
  a.step = t;
  return a;
}

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

class HostAdamWTest : public OpsTest {
 protected:
  // p ~ N(0, 0.5), grad ~ N(0, 1), m ~ N(0, 0.1), v ~ |N(0, 0.01)|: a mid-run state.
  void make_state(std::int64_t n, std::uint64_t seed) {
    p = randn({n}, seed, 0.5, 0.0, DType::f32);
    g = randn({n}, seed + 1, 1.0, 0.0, DType::f32);
    m = randn({n}, seed + 2, 0.1, 0.0, DType::f32);
    v = randn({n}, seed + 3, 0.01, 0.0, DType::f32);
    for (std::int64_t i = 0; i < n; ++i) v.data_as<float>()[i] = std::fabs(v.data_as<float>()[i]);
  }
  Tensor p, g, m, v;
};

// The CUDA kernel's per-element arithmetic as src/ops/cuda/adamw.cu spells it with the _rn
// intrinsics (host_adamw.h), restated here in scalar code, independent of adamw_host's vector path.
void cuda_order(float& p, float grad, float& m, float& v, const ops::AdamWStep& a) {
  const double t = static_cast<double>(a.step);
  const float decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  const float c1 = static_cast<float>(1.0 - a.beta1), c2 = static_cast<float>(1.0 - a.beta2);
  const float step = static_cast<float>(a.lr * std::sqrt(1.0 - std::pow(a.beta2, t)) / (1.0 - std::pow(a.beta1, t)));
  const float gg = grad * static_cast<float>(a.grad_scale);
  m = std::fma(c1, gg, static_cast<float>(a.beta1) * m);
  v = std::fma(c2 * gg, gg, static_cast<float>(a.beta2) * v);
  const float d = (step * m) / (std::sqrt(v) + static_cast<float>(a.eps));
  p = std::fma(decay, p, -d);
}

// Sizes that leave tails past the 8-wide vectors and the threads' 16-element parts.
TEST_F(HostAdamWTest, CudaKernelOrderBitwise) {
  for (const std::int64_t n : {1, 7, 8, 23, 1000, 4099}) {
    for (const int threads : {1, 3}) {
      make_state(n, 100 + static_cast<std::uint64_t>(n));
      Tensor p0 = clone(p), m0 = clone(m), v0 = clone(v);
      Tensor low = Tensor::empty({n}, DType::bf16, alloc, "test");
      const ops::AdamWStep a = hyper(5);
      ops::adamw_host(p, g, m, v, a, &low, AdamWArithmetic::cuda_kernel, threads);
      for (std::int64_t i = 0; i < n; ++i) {
        float pe = p0.data_as<float>()[i], me = m0.data_as<float>()[i], ve = v0.data_as<float>()[i];
        cuda_order(pe, g.data_as<float>()[i], me, ve, a);
        ASSERT_EQ(bits(pe), bits(p.data_as<float>()[i])) << "n " << n << " i " << i;
        ASSERT_EQ(bits(me), bits(m.data_as<float>()[i])) << "n " << n << " i " << i;
        ASSERT_EQ(bits(ve), bits(v.data_as<float>()[i])) << "n " << n << " i " << i;
        ASSERT_EQ(float_to_bf16(pe).bits, low.data_as<bf16_t>()[i].bits) << "n " << n << " i " << i;
      }
    }
  }
}

// The cpu_reference order is ops::adamw on the CPU, bit for bit, over several steps, with the
// bf16 and the fp16 working copy.
TEST_F(HostAdamWTest, CpuReferenceOrderMatchesOpsAdamwBitwise) {
  for (const DType low_dtype : {DType::bf16, DType::f16}) {
    const std::int64_t n = 1037;
    make_state(n, 7);
    Tensor p2 = clone(p), m2 = clone(m), v2 = clone(v);
    Tensor low = Tensor::empty({n}, low_dtype, alloc, "test"), low2 = Tensor::empty({n}, low_dtype, alloc, "test");
    for (std::int64_t t = 1; t <= 3; ++t) {
      ops::adamw_host(p, g, m, v, hyper(t), &low, AdamWArithmetic::cpu_reference, 2);
      ops::adamw(ctx, p2, g, m2, v2, hyper(t), &low2);
    }
    EXPECT_EQ(0, std::memcmp(p.data(), p2.data(), static_cast<std::size_t>(n) * 4));
    EXPECT_EQ(0, std::memcmp(m.data(), m2.data(), static_cast<std::size_t>(n) * 4));
    EXPECT_EQ(0, std::memcmp(v.data(), v2.data(), static_cast<std::size_t>(n) * 4));
    EXPECT_EQ(0, std::memcmp(low.data(), low2.data(), static_cast<std::size_t>(n) * 2));
  }
}

// Against float64 ops::adamw from the same fp32 state, one step. The fp32 run rounds its
// constants (beta1, 1-beta1, beta2, 1-beta2, grad_scale, step_size, 1-lr*wd: half an ulp each)
// and each operation; counting them, m is within 3 ulp and v within 4 ulp of the size of their
// terms (|b1 m| + |(1-b1) g|, resp. the v terms; g^2 doubles g's error), d = step*m/(sqrt v + eps)
// within ~8 ulp of |d|, and p = decay p - d one more rounding: |p32 - p64| <= 8 * 2^-24 * (|p| +
// |d|). Both orders must meet these bounds; a wrong formula misses them by orders of magnitude.
TEST_F(HostAdamWTest, WithinBoundOfFloat64Reference) {
  const std::int64_t n = 4096;
  const double u = std::ldexp(1.0, -24);
  for (const AdamWArithmetic order : {AdamWArithmetic::cuda_kernel, AdamWArithmetic::cpu_reference}) {
    make_state(n, 55);
    Tensor p64 = as(p, DType::f64), g64 = as(g, DType::f64), m64 = as(m, DType::f64), v64 = as(v, DType::f64);
    Tensor m_before = clone(m64), v_before = clone(v64), p_before = clone(p64);
    const ops::AdamWStep a = hyper(4);
    ops::adamw_host(p, g, m, v, a, nullptr, order, 2);
    ops::adamw(ctx, p64, g64, m64, v64, a, nullptr);
    double worst = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double gi = g64.data_as<double>()[i] * a.grad_scale;
      const double m_scale = std::fabs(a.beta1 * m_before.data_as<double>()[i]) + std::fabs((1 - a.beta1) * gi);
      const double v_scale = std::fabs(a.beta2 * v_before.data_as<double>()[i]) + (1 - a.beta2) * gi * gi;
      EXPECT_LE(std::fabs(m.data_as<float>()[i] - m64.data_as<double>()[i]), 4 * u * m_scale + 1e-45);
      EXPECT_LE(std::fabs(v.data_as<float>()[i] - v64.data_as<double>()[i]), 4 * u * v_scale + 1e-45);
      const double d = std::fabs(p_before.data_as<double>()[i] * (1 - a.lr * a.weight_decay) - p64.data_as<double>()[i]);
      const double bound = 8 * u * (std::fabs(p_before.data_as<double>()[i]) + d);
      const double err = std::fabs(p.data_as<float>()[i] - p64.data_as<double>()[i]);
      ASSERT_LE(err, bound) << "i " << i;
      worst = std::max(worst, err / bound);
    }
    std::printf("host adamw (%s order) vs float64: worst error %.3f of the bound\n",
                order == AdamWArithmetic::cuda_kernel ? "cuda_kernel" : "cpu_reference", worst);
  }
}

// The bf16 working copy: round to nearest, ties to even, NaN stays NaN, overflow to inf. With
// lr = 0 the update leaves p as it is (fma(1, p, -0) = p), so p's bit patterns reach the rounding.
TEST_F(HostAdamWTest, Bf16WorkingCopyRounding) {
  const std::vector<std::uint32_t> special = {
      0x3f808000u,   // 1 + 2^-8: a tie, rounds down to the even 0x3f80
      0x3f818000u,   // a tie rounding up to the even 0x3f82
      0x3f808001u,   // just above the tie: up
      0x7f7fffffu,   // the largest float: rounds to inf 0x7f80
      0x80000000u,   // -0
      0x00000001u,   // the smallest denormal: to +0
      0x7fc12345u,   // a quiet NaN: stays NaN
      0xff800000u,   // -inf
  };
  const std::vector<std::uint16_t> expected = {0x3f80, 0x3f82, 0x3f81, 0x7f80, 0x8000, 0x0000, 0x7fc1, 0xff80};
  const std::int64_t n = 8 * 64 + 5;
  Tensor p = Tensor::empty({n}, DType::f32, alloc, "test");
  Tensor z = full({n}, 0.0, DType::f32), m = full({n}, 0.0, DType::f32), v = full({n}, 0.0, DType::f32);
  const CounterRng rng(3, 4);
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u = i < static_cast<std::int64_t>(special.size())
                          ? special[static_cast<std::size_t>(i)]
                          : static_cast<std::uint32_t>(rng.uniform(static_cast<std::uint64_t>(i)) * 4294967295.0);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) u |= 0x400000u;   // only quiet NaNs
    std::memcpy(p.data_as<float>() + i, &u, 4);
  }
  Tensor p0 = clone(p);
  ops::AdamWStep a = hyper(1);
  a.lr = 0;
  Tensor low = Tensor::empty({n}, DType::bf16, alloc, "test");
  ops::adamw_host(p, z, m, v, a, &low, AdamWArithmetic::cuda_kernel, 1);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i], low.data_as<bf16_t>()[i].bits) << i;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t in = bits(p0.data_as<float>()[i]);
    const bool nan = (in & 0x7fffffffu) > 0x7f800000u;
    if (!nan) {
      ASSERT_EQ(in, bits(p.data_as<float>()[i])) << i;
    }
    ASSERT_EQ(float_to_bf16(p.data_as<float>()[i]).bits, low.data_as<bf16_t>()[i].bits) << i;
  }
}

// Bandwidth on this host: adamw_host (28 bytes of fp32 traffic per element plus 2 of bf16) against
// a triad a = b + s c (12 bytes per element), both with every hardware thread, best of 3.
TEST_F(HostAdamWTest, BandwidthAgainstTriad) {
  const std::int64_t n = std::int64_t{1} << 24;
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  make_state(n, 9);
  Tensor low = Tensor::empty({n}, DType::bf16, alloc, "test");
  Tensor ta = full({n}, 0.0, DType::f32), tb = full({n}, 1.0, DType::f32), tc = full({n}, 2.0, DType::f32);
  auto best_of_3 = [](auto&& fn) {
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  std::int64_t t = 1;
  const double adamw_s =
      best_of_3([&] { ops::adamw_host(p, g, m, v, hyper(t++), &low, AdamWArithmetic::cuda_kernel, threads); });
  float* a = ta.data_as<float>();
  const float* b = tb.data_as<float>();
  const float* c = tc.data_as<float>();
  const double triad_s = best_of_3([&] {
    std::vector<std::thread> workers;
    for (int k = 0; k < threads; ++k) {
      workers.emplace_back([=] {
        for (std::int64_t i = n * k / threads; i < n * (k + 1) / threads; ++i) a[i] = b[i] + 3.0f * c[i];
      });
    }
    for (auto& w : workers) w.join();
  });
  const double adamw_gbs = 30.0 * static_cast<double>(n) / adamw_s / 1e9;
  // STREAM counts the triad's 12 bytes; its store to `a` also reads each line first (16 bytes
  // move), where AdamW writes only lines it has read.
  const double triad_gbs = 12.0 * static_cast<double>(n) / triad_s / 1e9;
  std::printf("host adamw: %lld elements, %d threads, %s: %.2f ms, %.2f GB/s; triad %.2f GB/s (STREAM bytes), "
              "%.2f GB/s (with the store's line reads); adamw / triad %.2f resp. %.2f\n",
              static_cast<long long>(n), threads, ops::adamw_host_vectorised() ? "AVX2+FMA" : "scalar",
              adamw_s * 1e3, adamw_gbs, triad_gbs, triad_gbs * 16 / 12, adamw_gbs / triad_gbs,
              adamw_gbs / (triad_gbs * 16 / 12));
  EXPECT_FLOAT_EQ(a[n - 1], 7.0f);
  EXPECT_TRUE(std::isfinite(p.data_as<float>()[n - 1]));
}

}  // namespace
}  // namespace lmscale::test
