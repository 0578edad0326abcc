// The FP8 ops on the CPU (lmscale/ops/fp8.h, ops/fp8_scaling.h): amax with specials, the
// saturating scaled cast, the transpose, the power-of-two scale rule, both scaling recipes, and
// the FP8 GEMM against an fp64 product of the decoded operands and against the exact product of
// the unquantised data within the bound derived in docs/precision.md.
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/core/fp8.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_scaling.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

class Fp8OpsTest : public OpsTest {
 protected:
  Tensor f32(const std::vector<float>& v) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::f32, alloc, "test");
    std::memcpy(t.data(), v.data(), v.size() * 4);
    return t;
  }
  Tensor scalar(float v) { return f32({v}); }
  Tensor codes(const Shape& s, DType t) {
    Tensor c = Tensor::empty(s, t, alloc, "test");
    std::memset(c.data(), 0xAB, c.nbytes());   // a valid code that no expected value uses
    return c;
  }
  static float get(const Tensor& t, std::int64_t i = 0) { return t.data_as<float>()[i]; }
  static std::uint32_t bits(const Tensor& t) { return std::bit_cast<std::uint32_t>(get(t)); }
};

TEST_F(Fp8OpsTest, Amax) {
  Tensor out = scalar(-1.f);
  ops::amax(ctx, f32({0.5f, -3.25f, 2.f}), out);
  EXPECT_EQ(get(out), 3.25f);
  ops::amax(ctx, f32({1.f, -kInf}), out);
  EXPECT_EQ(get(out), kInf);
  ops::amax(ctx, f32({1.f, -kNaN, kInf}), out);   // NaN dominates inf, as the canonical quiet NaN
  EXPECT_EQ(bits(out), 0x7FC00000u);
  ops::amax(ctx, f32({}), out);
  EXPECT_EQ(get(out), 0.f);
  Tensor d = full({3}, -1.0 - 1e-12, DType::f64);   // fp64 rounds to fp32 first
  ops::amax(ctx, d, out);
  EXPECT_EQ(get(out), 1.f);
  Tensor h = as(f32({-7.5f, 2.f}), DType::bf16);
  ops::amax(ctx, h, out);
  EXPECT_EQ(get(out), 7.5f);
}

TEST_F(Fp8OpsTest, CastSaturatesAndKeepsSpecials) {
  const Tensor x = f32({1.f, -1000.f, kInf, kNaN, 0.25f, -0.f, 3.f, 1e-6f});
  Tensor amax_out = scalar(0.f);
  Tensor q = codes({8}, DType::e4m3);
  ops::cast_fp8(ctx, x, scalar(2.f), q, &amax_out);
  const std::uint8_t want[] = {0x40, 0xFE, 0x7E, 0x7F, 0x30, 0x80, 0x4C, 0x00};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.data_as<std::uint8_t>()[i], want[i]) << "element " << i;
  EXPECT_EQ(bits(amax_out), 0x7FC00000u);   // x holds a NaN
  Tensor q5 = codes({8}, DType::e5m2);
  ops::cast_fp8(ctx, x, scalar(2.f), q5, nullptr);
  const std::uint8_t want5[] = {0x40, 0xE8, 0x7B, 0x7F, 0x38, 0x80, 0x46, 0x00};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q5.data_as<std::uint8_t>()[i], want5[i]) << "element " << i;
  // Every element is the host conversion of the fp32 product.
  const Tensor r = randn({1000}, 3, 50.0, 0.0, DType::f32);
  Tensor qr = codes({1000}, DType::e4m3);
  ops::cast_fp8(ctx, r, scalar(4.f), qr, &amax_out);
  float m = 0;
  for (std::int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(qr.data_as<std::uint8_t>()[i], float_to_fp8(get(r, i) * 4.f, Fp8Format::e4m3)) << i;
    m = std::max(m, std::fabs(get(r, i)));
  }
  EXPECT_EQ(get(amax_out), m);
  Tensor bad = codes({3}, DType::e4m3);
  EXPECT_THROW(ops::cast_fp8(ctx, f32({1.f, 2.f}), scalar(1.f), bad, nullptr), std::exception);
  Tensor not_fp8 = Tensor::empty({2}, DType::bf16, alloc, "test");
  EXPECT_THROW(ops::cast_fp8(ctx, f32({1.f, 2.f}), scalar(1.f), not_fp8, nullptr), std::exception);
}

TEST_F(Fp8OpsTest, Transpose) {
  Tensor x = codes({3, 5}, DType::e4m3);
  for (int i = 0; i < 15; ++i) x.data_as<std::uint8_t>()[i] = static_cast<std::uint8_t>(i);
  Tensor t = codes({5, 3}, DType::e4m3);
  ops::transpose_fp8(ctx, x, t);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) EXPECT_EQ(t.data_as<std::uint8_t>()[c * 3 + r], r * 5 + c);
  Tensor wrong = codes({3, 5}, DType::e4m3);
  EXPECT_THROW(ops::transpose_fp8(ctx, x, wrong), std::exception);
}

TEST_F(Fp8OpsTest, ScaleRule) {
  struct Case {
    std::vector<float> history;
    Fp8Format f;
    int margin;
    float scale;   // expected; 0 = unchanged
  };
  const Case cases[] = {
      {{1.f}, Fp8Format::e4m3, 0, 256.f},         // 256 <= 448 < 512
      {{1.f}, Fp8Format::e4m3, 1, 128.f},
      {{448.f}, Fp8Format::e4m3, 0, 1.f},
      {{449.f}, Fp8Format::e4m3, 0, 0.5f},
      {{224.f}, Fp8Format::e4m3, 0, 2.f},          // exactly 448 after scaling
      {{1.f}, Fp8Format::e5m2, 0, 32768.f},
      {{0.f, 3.f, 1.f}, Fp8Format::e4m3, 0, 128.f},  // the history's maximum
      {{kNaN, 2.f}, Fp8Format::e4m3, 0, 128.f},      // NaN skipped
      {{1e-45f}, Fp8Format::e4m3, 0, std::ldexp(1.f, 126)},   // clamped
      {{3e38f}, Fp8Format::e4m3, 0, std::ldexp(1.f, -120)},
      {{0.f, 0.f}, Fp8Format::e4m3, 0, 0.f},
      {{kNaN}, Fp8Format::e4m3, 0, 0.f},
      {{kInf, 1.f}, Fp8Format::e4m3, 0, 0.f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "history[0] " << c.history[0] << " " << fp8_format_name(c.f) << " margin "
                                      << c.margin);
    Tensor scale = scalar(3.f), inv = scalar(5.f);
    ops::fp8_update_scale(ctx, f32(c.history), c.f, c.margin, scale, inv);
    if (c.scale == 0.f) {
      EXPECT_EQ(get(scale), 3.f);
      EXPECT_EQ(get(inv), 5.f);
    } else {
      EXPECT_EQ(get(scale), c.scale);
      EXPECT_EQ(get(inv) * get(scale), 1.f);
    }
  }
}

// Quantising with the scale of the data's own amax and dequantising with its inverse gives back
// every fp8-representable value exactly and every other within half an fp8 spacing.
TEST_F(Fp8OpsTest, ScaleRoundTrip) {
  const Tensor x = randn({4096}, 11, 0.02, 0.0, DType::f32);
  ops::Fp8TensorScaling s(ctx, Fp8Format::e4m3, ops::Fp8Recipe::current, 1, 0);
  Tensor q = codes({4096}, DType::e4m3);
  s.quantize(ctx, x, q);
  const float inv = get(s.inv_scale());
  for (std::int64_t i = 0; i < 4096; ++i) {
    const float back = fp8_to_float(q.data_as<std::uint8_t>()[i], Fp8Format::e4m3) * inv;
    const float xi = get(x, i);
    // Normal range: relative error <= 2^-4; subnormal range: absolute <= 2^-10 * inv.
    EXPECT_LE(std::fabs(back - xi), std::max(std::fabs(xi) / 16, std::ldexp(inv, -10))) << i;
    // The dequantised value is itself representable: it survives a second round trip exactly.
    Tensor one = f32({back}), q1 = codes({1}, DType::e4m3);
    ops::cast_fp8(ctx, one, s.scale(), q1, nullptr);
    EXPECT_EQ(q1.data_as<std::uint8_t>()[0], q.data_as<std::uint8_t>()[i]) << i;
  }
}

TEST_F(Fp8OpsTest, CurrentScalingUsesTheAmaxOfNow) {
  ops::Fp8TensorScaling s(ctx, Fp8Format::e4m3, ops::Fp8Recipe::current, 16, 0);
  EXPECT_EQ(s.amax_history().numel(), 1);
  Tensor q = codes({3}, DType::e4m3);
  s.quantize(ctx, f32({10.f, -1.f, 0.f}), q);
  EXPECT_EQ(get(s.scale()), 32.f);   // 320 <= 448 < 640
  EXPECT_EQ(get(s.inv_scale()), 1.f / 32);
  EXPECT_EQ(q.data_as<std::uint8_t>()[0], float_to_fp8(320.f, Fp8Format::e4m3));
  Tensor first = q.flat_range(0, 1);
  s.quantize(ctx, f32({1000.f}), first);
  EXPECT_EQ(get(s.scale()), 0.25f);   // no saturation: the scale follows at once
  EXPECT_EQ(q.data_as<std::uint8_t>()[0], float_to_fp8(250.f, Fp8Format::e4m3));
}

TEST_F(Fp8OpsTest, DelayedScalingUsesTheHistory) {
  ops::Fp8TensorScaling s(ctx, Fp8Format::e4m3, ops::Fp8Recipe::delayed, 3, 0);
  Tensor q = codes({1}, DType::e4m3);
  // 1st cast: empty history, scale 1: 1000 saturates at 448; its amax is recorded.
  s.quantize(ctx, f32({1000.f}), q);
  EXPECT_EQ(get(s.scale()), 1.f);
  EXPECT_EQ(q.data_as<std::uint8_t>()[0], 0x7E);
  EXPECT_EQ(get(s.amax_history(), 0), 1000.f);
  // 2nd, 3rd: scale from 1000 (0.25), amaxes 1 and 1 recorded.
  s.quantize(ctx, f32({1.f}), q);
  EXPECT_EQ(get(s.scale()), 0.25f);
  s.quantize(ctx, f32({1.f}), q);
  EXPECT_EQ(get(s.scale()), 0.25f);
  EXPECT_EQ(s.next_slot(ctx), 0);   // the ring wraps
  // 4th: history {1000, 1, 1} still holds 1000; its amax (1) overwrites slot 0.
  s.quantize(ctx, f32({1.f}), q);
  EXPECT_EQ(get(s.scale()), 0.25f);
  EXPECT_EQ(get(s.amax_history(), 0), 1.f);
  // 5th: 1000 has left the window: scale from 1.
  s.quantize(ctx, f32({1.f}), q);
  EXPECT_EQ(get(s.scale()), 256.f);
  EXPECT_EQ(q.data_as<std::uint8_t>()[0], float_to_fp8(256.f, Fp8Format::e4m3));
}

// Random codes of a format (NaN and inf codes left out).
Tensor random_codes(HostAllocator& alloc, const Shape& s, DType t, std::uint64_t seed) {
  Tensor c = Tensor::empty(s, t, alloc, "test");
  const CounterRng rng(seed, 5);
  const Fp8Format f = fp8_format(t);
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    std::uint8_t v;
    std::uint64_t k = static_cast<std::uint64_t>(i);
    do v = static_cast<std::uint8_t>(rng.uniform(k++ * 131) * 256);
    while (!std::isfinite(fp8_to_float(v, f)));
    c.data_as<std::uint8_t>()[i] = v;
  }
  return c;
}

TEST_F(Fp8OpsTest, FusedScaleUpdatesEqualTheSeparateOps) {
  // fp8_amax_update_scale = amax into the slot, then fp8_update_scale; cast_fp8 with a history
  // update = fp8_update_scale, the cast with the new scale, then (record) the amax into the slot,
  // which the update read before it was replaced.
  const Tensor x = f32({0.5f, -600.f, 2.f, 1e-9f, -kInf});
  for (const std::vector<float>& hist : {std::vector<float>{0.f, 0.f, 0.f}, {1.f, kNaN, 3.5f}, {7.f, 0.25f, 9e3f}}) {
    for (int margin : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << hist[0] << " " << hist[2] << " margin " << margin);
      Tensor work = Tensor::empty({2}, DType::i32, alloc, "test");
      std::memset(work.data(), 0, 8);
      // The fused amax pass.
      Tensor h1 = f32(hist), s1 = scalar(3.f), i1 = scalar(5.f);
      ops::fp8_amax_update_scale(ctx, x, h1, 1, Fp8Format::e4m3, margin, s1, i1, work);
      Tensor h2 = f32(hist), s2 = scalar(3.f), i2 = scalar(5.f), slot = h2.flat_range(1, 1);
      ops::amax(ctx, x, slot);
      ops::fp8_update_scale(ctx, h2, Fp8Format::e4m3, margin, s2, i2);
      EXPECT_EQ(get(h1, 1), kInf);
      for (std::int64_t i = 0; i < 3; ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(get(h1, i)), std::bit_cast<std::uint32_t>(get(h2, i)));
      EXPECT_EQ(bits(s1), bits(s2));
      EXPECT_EQ(bits(i1), bits(i2));
      // The fused delayed cast, recording into slot 2 and not recording.
      for (std::int64_t record : {std::int64_t{2}, std::int64_t{-1}}) {
        Tensor h3 = f32(hist), s3 = scalar(3.f), i3 = scalar(5.f), q3 = codes({5}, DType::e5m2);
        const ops::Fp8HistoryUpdate u{h3, record, Fp8Format::e5m2, margin, i3, work};
        ops::cast_fp8(ctx, x, s3, q3, nullptr, &u);
        Tensor h4 = f32(hist), s4 = scalar(3.f), i4 = scalar(5.f), q4 = codes({5}, DType::e5m2), a4 = scalar(-1.f);
        ops::fp8_update_scale(ctx, h4, Fp8Format::e5m2, margin, s4, i4);
        ops::cast_fp8(ctx, x, s4, q4, &a4);
        if (record >= 0) h4.data_as<float>()[record] = get(a4);
        EXPECT_EQ(std::memcmp(q3.data(), q4.data(), 5), 0);
        EXPECT_EQ(std::memcmp(h3.data(), h4.data(), 12), 0);
        EXPECT_EQ(bits(s3), bits(s4));
        EXPECT_EQ(bits(i3), bits(i4));
        if (hist[0] == 0.f) EXPECT_EQ(get(s3), 3.f) << "no usable amax: the scale is kept";
      }
      // Misuse is refused: an amax_out beside the update, a wrong work tensor, a slot outside.
      Tensor h5 = f32(hist), s5 = scalar(1.f), i5 = scalar(1.f), q5 = codes({5}, DType::e4m3), a5 = scalar(0.f);
      const ops::Fp8HistoryUpdate ok{h5, 0, Fp8Format::e4m3, margin, i5, work};
      EXPECT_THROW(ops::cast_fp8(ctx, x, s5, q5, &a5, &ok), Error);
      const ops::Fp8HistoryUpdate far{h5, 3, Fp8Format::e4m3, margin, i5, work};
      EXPECT_THROW(ops::cast_fp8(ctx, x, s5, q5, nullptr, &far), Error);
      Tensor bad_work = f32({0.f, 0.f});
      EXPECT_THROW(ops::fp8_amax_update_scale(ctx, x, h5, 0, Fp8Format::e4m3, margin, s5, i5, bad_work), Error);
    }
  }
}

TEST_F(Fp8OpsTest, CastTransposeIsTheCastThenTheTranspose) {
  // One pass writes the cast and its transpose (either alone), bitwise cast_fp8 + transpose_fp8,
  // with a given scale and with delayed scaling's history update (the amax recorded after).
  const std::int64_t M = 5, K = 7;
  std::vector<float> v(static_cast<std::size_t>(M * K));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(static_cast<float>(i % 11) - 5.3f, static_cast<int>(i % 9) - 2);
  v[3] = kNaN;
  v[8] = -kInf;
  v[20] = 1e5f;   // saturates at scale 1
  const Tensor x = f32(v).reshape({M, K});
  for (bool with_update : {false, true})
    for (bool with_out : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "update " << with_update << " out " << with_out);
      Tensor work = Tensor::empty({2}, DType::i32, alloc, "test");
      std::memset(work.data(), 0, 8);
      Tensor h1 = f32({2.f, 40.f}), s1 = scalar(1.f), i1 = scalar(1.f);
      Tensor q1 = codes({M, K}, DType::e4m3), t1 = codes({K, M}, DType::e4m3);
      const ops::Fp8HistoryUpdate u1{h1, 1, Fp8Format::e4m3, 0, i1, work};
      ops::cast_transpose_fp8(ctx, x, s1, with_out ? &q1 : nullptr, &t1, with_update ? &u1 : nullptr);
      Tensor h2 = f32({2.f, 40.f}), s2 = scalar(1.f), i2 = scalar(1.f);
      Tensor q2 = codes({M, K}, DType::e4m3), t2 = codes({K, M}, DType::e4m3);
      const ops::Fp8HistoryUpdate u2{h2, 1, Fp8Format::e4m3, 0, i2, work};
      ops::cast_fp8(ctx, x, s2, q2, nullptr, with_update ? &u2 : nullptr);
      ops::transpose_fp8(ctx, q2, t2);
      EXPECT_EQ(std::memcmp(t1.data(), t2.data(), M * K), 0);
      if (with_out) EXPECT_EQ(std::memcmp(q1.data(), q2.data(), M * K), 0);
      else EXPECT_EQ(q1.data_as<std::uint8_t>()[0], 0xAB) << "no direct output asked for";
      EXPECT_EQ(std::memcmp(h1.data(), h2.data(), 8), 0);
      EXPECT_EQ(bits(s1), bits(s2));
      EXPECT_EQ(bits(i1), bits(i2));
      if (with_update) EXPECT_EQ(get(s1), 8.f) << "the scale of the history's 40 (40 x 2^3 <= 448)";
    }
  Tensor s = scalar(1.f), t = codes({K, M}, DType::e4m3), wrong = codes({M, K}, DType::e5m2);
  EXPECT_THROW(ops::cast_transpose_fp8(ctx, x, s, nullptr, nullptr), Error);
  EXPECT_THROW(ops::cast_transpose_fp8(ctx, x, s, &wrong, &t), Error);          // dtypes differ
  EXPECT_THROW(ops::cast_transpose_fp8(ctx, x, s, nullptr, &wrong), Error);     // not [K, M]
}

TEST_F(Fp8OpsTest, GatherScalarsWritesEachSourceAtItsStride) {
  // A linear layer's four saved scales in one launch (Fp8LinearSaved: 16 bytes apart); the
  // padding between is left as it was.
  const Tensor a = scalar(1.5f), b = scalar(-kInf), c = scalar(kNaN), d = scalar(0.25f);
  Tensor out = f32(std::vector<float>(16, 7.f));
  ops::gather_scalars(ctx, {&a, &b, &c, &d}, out, 4);
  for (std::int64_t i = 0; i < 16; ++i) {
    if (i % 4 != 0) {
      EXPECT_EQ(get(out, i), 7.f) << i;
      continue;
    }
    const Tensor& src = i == 0 ? a : i == 4 ? b : i == 8 ? c : d;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(get(out, i)), bits(src)) << i;
  }
  Tensor small = f32(std::vector<float>(12, 0.f));
  EXPECT_THROW(ops::gather_scalars(ctx, {&a, &b, &c, &d}, small, 4), Error);   // needs 13 elements
  EXPECT_THROW(ops::gather_scalars(ctx, {&a, &a, &a, &a, &a, &a, &a, &a, &a}, out, 1), Error);   // 9 sources
  const Tensor two = f32({1.f, 2.f});
  EXPECT_THROW(ops::gather_scalars(ctx, {&two}, out, 1), Error);
}

TEST_F(Fp8OpsTest, LinearFp8DecodesAndMultiplies) {
  const std::int64_t M = 7, N = 5, K = 32;
  const Tensor a = random_codes(alloc, {M, K}, DType::e5m2, 1), b = random_codes(alloc, {N, K}, DType::e4m3, 2);
  for (DType yt : {DType::f64, DType::f32}) {
    Tensor y = poisoned({M, N}, yt);
    ops::linear_fp8(ctx, a, scalar(0.5f), b, scalar(0.125f), y, false);
    const auto got = values(y);
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (std::int64_t k = 0; k < K; ++k)
          acc += static_cast<double>(fp8_to_float(a.data_as<std::uint8_t>()[i * K + k], Fp8Format::e5m2)) *
                 fp8_to_float(b.data_as<std::uint8_t>()[j * K + k], Fp8Format::e4m3);
        const double want = acc * 0.0625;
        EXPECT_NEAR(got[static_cast<std::size_t>(i * N + j)], want, yt == DType::f64 ? 1e-12 : 1e-6 * std::fabs(want))
            << i << "," << j;
      }
    const auto before = values(y);
    ops::linear_fp8(ctx, a, scalar(0.5f), b, scalar(0.125f), y, true);   // accumulates: twice the value
    const auto after = values(y);
    for (std::size_t e = 0; e < after.size(); ++e) EXPECT_NEAR(after[e], 2 * before[e], 1e-6 * std::fabs(before[e]));
  }
  Tensor y = poisoned({M, N}, DType::f64);
  const Tensor a5 = random_codes(alloc, {N, K}, DType::e5m2, 3);
  EXPECT_THROW(ops::linear_fp8(ctx, a, scalar(1.f), a5, scalar(1.f), y, false), std::exception);   // e5m2 x e5m2
  Tensor y_bad = poisoned({M, N + 1}, DType::f64);
  EXPECT_THROW(ops::linear_fp8(ctx, a, scalar(1.f), b, scalar(1.f), y_bad, false), std::exception);
}

// The three products of a linear layer in FP8 against the exact (fp64) products of the
// unquantised data, element by element within the bound of docs/precision.md:
//   |y_q - y| <= (u_x + u_w + u_x u_w) sum_k |x_k w_k|
//                + sum_k ((1 + u_x) |x_k| d_w + (1 + u_w) |w_k| d_x + d_x d_w)
// with u = 2^-4 (e4m3) or 2^-3 (e5m2) the unit roundoff of each operand's format and d = 2^-10 /
// scale (e4m3) or 2^-17 / scale (e5m2) its largest absolute error in the subnormal range.
TEST_F(Fp8OpsTest, LinearLayerWithinDerivedBound) {
  const std::int64_t M = 24, K = 48, N = 16;
  const Tensor x = randn({M, K}, 21, 1.0), w = randn({N, K}, 22, 0.05), dy = randn({M, N}, 23, 1e-3);
  struct Operand {
    Tensor q;
    double u, d;
    Tensor inv;
  };
  auto quantize = [&](const Tensor& t, Fp8Format f) {
    ops::Fp8TensorScaling s(ctx, f, ops::Fp8Recipe::current, 1, 0);
    Tensor t32 = as(t, DType::f32);
    Tensor q = Tensor::empty(t.shape(), fp8_dtype(f), alloc, "test");
    s.quantize(ctx, t32, q);
    const double inv = get(s.inv_scale());
    const bool e4 = f == Fp8Format::e4m3;
    return Operand{q, e4 ? 1.0 / 16 : 1.0 / 8, std::ldexp(inv, e4 ? -10 : -17), s.inv_scale()};
  };
  auto transpose = [&](const Tensor& q) {
    Tensor t = Tensor::empty({q.dim(1), q.dim(0)}, q.dtype(), alloc, "test");
    ops::transpose_fp8(ctx, q, t);
    return t;
  };
  auto transpose64 = [&](const Tensor& t) {
    Tensor o = Tensor::empty({t.dim(1), t.dim(0)}, DType::f64, alloc, "test");
    for (std::int64_t r = 0; r < t.dim(0); ++r)
      for (std::int64_t c = 0; c < t.dim(1); ++c) o.data_as<double>()[c * t.dim(0) + r] = t.data_as<double>()[r * t.dim(1) + c];
    return o;
  };
  // Checks out[R,C] = p[R,L] . q[C,L]^T against the exact product.
  auto check = [&](const char* what, const Tensor& got, const Tensor& p, const Operand& pq, const Tensor& q,
                   const Operand& qq) {
    SCOPED_TRACE(what);
    const std::int64_t R = p.dim(0), C = q.dim(0), L = p.dim(1);
    int failures = 0;
    for (std::int64_t i = 0; i < R; ++i)
      for (std::int64_t j = 0; j < C; ++j) {
        double exact = 0, abs_sum = 0, sub = 0;
        for (std::int64_t k = 0; k < L; ++k) {
          const double pv = p.data_as<double>()[i * L + k], qv = q.data_as<double>()[j * L + k];
          exact += pv * qv;
          abs_sum += std::fabs(pv * qv);
          sub += (1 + pq.u) * std::fabs(pv) * qq.d + (1 + qq.u) * std::fabs(qv) * pq.d + pq.d * qq.d;
        }
        const double bound = (pq.u + qq.u + pq.u * qq.u) * abs_sum + sub + 1e-6 * abs_sum;   // + fp32 output
        const double err = std::fabs(got.data_as<float>()[i * C + j] - exact);
        if (!(err <= bound) && ++failures <= 5)
          ADD_FAILURE() << "(" << i << "," << j << "): |error| " << err << " > bound " << bound << " (exact " << exact
                        << ")";
      }
    EXPECT_EQ(failures, 0);
  };
  const Operand xq = quantize(x, Fp8Format::e4m3), wq = quantize(w, Fp8Format::e4m3),
                dyq = quantize(dy, Fp8Format::e5m2);
  Tensor y = poisoned({M, N}, DType::f32), dx = poisoned({M, K}, DType::f32), dw = poisoned({N, K}, DType::f32);
  ops::linear_fp8(ctx, xq.q, xq.inv, wq.q, wq.inv, y, false);
  ops::linear_fp8(ctx, dyq.q, dyq.inv, transpose(wq.q), wq.inv, dx, false);
  ops::linear_fp8(ctx, transpose(dyq.q), dyq.inv, transpose(xq.q), xq.inv, dw, false);
  check("forward y = x w^T", y, x, xq, w, wq);
  check("data gradient dx = dy w", dx, dy, dyq, transpose64(w), wq);
  check("weight gradient dw = dy^T x", dw, transpose64(dy), dyq, transpose64(x), xq);
  // The bound is not vacuous: the normwise error is well inside it and far from zero.
  Tensor y64 = poisoned({M, N});
  ops::linear(ctx, x, w, y64);
  const double rel = max_rel_diff(y, y64);
  std::printf("forward: max |error| / max |y| = %.3g\n", rel);
  EXPECT_GT(rel, 1e-4);
  EXPECT_LT(rel, 0.1);
}

// The casts fused into SwiGLU (ops::swiglu_cast_transpose_fp8 and its backward) on the CPU, where
// they compose the plain producer and the cast: the codes, transpose, scale and history of the
// fused call equal those of swiglu_rows / swiglu_rows_backward into a tensor, then
// cast_transpose_fp8, under a delayed update (a, b column blocks of one a|b [rows, 2F], ld = 2F);
// bad arguments are refused by name. The CUDA kernel is held to the same bits in
// gpu.test_producer_casts_cuda.
TEST_F(Fp8OpsTest, SwigluCastsAreTheProducerThenTheCast) {
  const std::int64_t rows = 6, F = 5, ld = 2 * F, extent = (rows - 1) * ld + F;
  const Tensor ab = randn({rows, 2 * F}, 3, 2.0, 0.0, DType::f32), dh = randn({rows, F}, 4, 1.0, 0.0, DType::f32);
  const Tensor a = ab.flat_range(0, extent), b = ab.flat_range(F, extent);
  struct State {
    Tensor scale, inv, history, work;
  };
  auto state = [&] {
    State st{scalar(1.f), scalar(1.f), f32({3.f, 40.f, 0.5f}), Tensor::empty({2}, DType::i32, alloc, "test")};
    std::memset(st.work.data(), 0, 8);
    return st;
  };
  auto bytes = [](const Tensor& t) {
    const auto* p = static_cast<const std::uint8_t*>(t.data());
    return std::vector<std::uint8_t>(p, p + t.nbytes());
  };
  for (bool backward : {false, true}) {
    const std::int64_t C = backward ? 2 * F : F;
    const DType q = backward ? DType::e5m2 : DType::e4m3;
    const Fp8Format f = backward ? Fp8Format::e5m2 : Fp8Format::e4m3;
    State fs = state(), ps = state();
    Tensor fq = codes({rows, C}, q), fqt = codes({C, rows}, q), pq = codes({rows, C}, q), pqt = codes({C, rows}, q);
    const ops::Fp8HistoryUpdate fu{fs.history, 1, f, 0, fs.inv, fs.work}, pu{ps.history, 1, f, 0, ps.inv, ps.work};
    Tensor plain = Tensor::empty({rows, C}, DType::f32, alloc, "test");
    if (backward) {
      ops::swiglu_backward_cast_transpose_fp8(ctx, a, b, rows, F, ld, dh, fs.scale, &fq, fqt, &fu);
      Tensor da = plain.flat_range(0, extent), db = plain.flat_range(F, extent);
      ops::swiglu_rows_backward(ctx, a, b, rows, F, ld, dh, da, db);
    } else {
      ops::swiglu_cast_transpose_fp8(ctx, a, b, rows, F, ld, fs.scale, &fq, fqt, &fu);
      ops::swiglu_rows(ctx, a, b, rows, F, ld, plain);
    }
    ops::cast_transpose_fp8(ctx, plain, ps.scale, &pq, &pqt, &pu);
    const char* what = backward ? "backward" : "forward";
    EXPECT_EQ(bytes(fq), bytes(pq)) << what;
    EXPECT_EQ(bytes(fqt), bytes(pqt)) << what;
    EXPECT_EQ(bytes(fs.history), bytes(ps.history)) << what;
    EXPECT_EQ(bits(fs.scale), bits(ps.scale)) << what;
    EXPECT_NE(get(fs.history, 1), 40.f) << what << ": the cast recorded no amax";
    EXPECT_NE(bits(fs.scale), bits(scalar(1.f))) << what << ": the scale was not derived from the history";
  }
  // Refused: da|db of a and b that are not one [rows, 2F] a|b; out_t of the wrong shape.
  Tensor t2 = codes({2 * F, rows}, DType::e5m2), t1 = codes({rows, F}, DType::e4m3);
  const Tensor wide = randn({rows, 3 * F}, 5, 1.0, 0.0, DType::f32);
  EXPECT_THROW(ops::swiglu_backward_cast_transpose_fp8(ctx, wide, wide.flat_range(F, (rows - 1) * 3 * F + F), rows, F,
                                                       3 * F, dh, scalar(1.f), nullptr, t2),
               Error);
  EXPECT_THROW(ops::swiglu_cast_transpose_fp8(ctx, a, b, rows, F, ld, scalar(1.f), nullptr, t1), Error);
  // A producer cast needs delayed scaling (current scaling's scale needs the tensor's amax first).
  ops::Fp8TensorScaling current(ctx, Fp8Format::e4m3, ops::Fp8Recipe::current, 1, 0);
  EXPECT_THROW(current.quantize_in_producer([](const Tensor&, const ops::Fp8HistoryUpdate&) {}), Error);
}

}  // namespace
}  // namespace lmscale::test
