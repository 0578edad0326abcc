// The FP8 formats' host conversions (lmscale/core/fp8.h): every code decodes and re-encodes to
// itself; rounding, ties, saturation, NaN and inf cases as __nv_cvt_float_to_fp8 documents them
// (cuda_fp8.h); and an independent oracle (the nearest of the 256 decoded values, ties to the
// even code) on random and boundary inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "lmscale/core/dtype.h"
#include "lmscale/core/fp8.h"

namespace lmscale {
namespace {

const Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

bool is_nan_code(std::uint8_t c, Fp8Format f) {
  const int mag = c & 0x7F;
  return f == Fp8Format::e4m3 ? mag == 0x7F : mag > 0x7C;
}
bool is_inf_code(std::uint8_t c, Fp8Format f) { return f == Fp8Format::e5m2 && (c & 0x7F) == 0x7C; }

TEST(Fp8, DTypes) {
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::e5m2), 1u);
  EXPECT_STREQ(dtype_name(DType::e4m3), "fp8_e4m3");
  EXPECT_STREQ(dtype_name(DType::e5m2), "fp8_e5m2");
  EXPECT_FALSE(is_floating(DType::e4m3));   // storage only: the general ops refuse it
  for (Fp8Format f : kFormats) EXPECT_EQ(fp8_format(fp8_dtype(f)), f);
  EXPECT_THROW(fp8_format(DType::bf16), std::exception);
  EXPECT_EQ(fp8_max(Fp8Format::e4m3), 448.f);
  EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.f);
}

TEST(Fp8, KnownCodes) {
  const auto e4 = [](int c) { return fp8_to_float(static_cast<std::uint8_t>(c), Fp8Format::e4m3); };
  const auto e5 = [](int c) { return fp8_to_float(static_cast<std::uint8_t>(c), Fp8Format::e5m2); };
  EXPECT_EQ(e4(0x38), 1.f);
  EXPECT_EQ(e4(0x7E), 448.f);
  EXPECT_EQ(e4(0xFE), -448.f);
  EXPECT_EQ(e4(0x01), std::ldexp(1.f, -9));   // smallest subnormal
  EXPECT_EQ(e4(0x08), std::ldexp(1.f, -6));   // smallest normal
  EXPECT_TRUE(std::isnan(e4(0x7F)) && std::isnan(e4(0xFF)));
  EXPECT_TRUE(std::signbit(e4(0x80)) && e4(0x80) == 0.f);
  EXPECT_EQ(e5(0x3C), 1.f);
  EXPECT_EQ(e5(0x7B), 57344.f);
  EXPECT_EQ(e5(0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(e5(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(e5(0xFC), -std::numeric_limits<float>::infinity());
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(std::isnan(e5(c))) << c;
}

TEST(Fp8, EveryCodeRoundTrips) {
  for (Fp8Format f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<std::uint8_t>(c);
      SCOPED_TRACE(::testing::Message() << fp8_format_name(f) << " code 0x" << std::hex << c);
      const float v = fp8_to_float(code, f);
      if (is_nan_code(code, f)) {
        EXPECT_TRUE(std::isnan(v));
        EXPECT_EQ(float_to_fp8(v, f, Fp8Overflow::satfinite), 0x7F);
        EXPECT_EQ(float_to_fp8(v, f, Fp8Overflow::nosat), 0x7F);
      } else if (is_inf_code(code, f)) {
        EXPECT_EQ(float_to_fp8(v, f, Fp8Overflow::nosat), code);
        EXPECT_EQ(float_to_fp8(v, f, Fp8Overflow::satfinite), (code & 0x80) | 0x7B);
      } else {
        EXPECT_EQ(float_to_fp8(v, f, Fp8Overflow::satfinite), code);
        EXPECT_EQ(float_to_fp8(v, f, Fp8Overflow::nosat), code);
      }
    }
}

TEST(Fp8, RoundingSaturationAndSpecials) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const auto e4 = [](float x, Fp8Overflow o = Fp8Overflow::satfinite) { return float_to_fp8(x, Fp8Format::e4m3, o); };
  const auto e5 = [](float x, Fp8Overflow o = Fp8Overflow::satfinite) { return float_to_fp8(x, Fp8Format::e5m2, o); };
  // Ties to even in the normal range: 1 + 1/16 lies between 1 (mantissa 000) and 1.125 (001).
  EXPECT_EQ(e4(1.f + 1.f / 16), 0x38);
  EXPECT_EQ(e4(1.f + 3.f / 16), 0x3A);   // between 1.125 (001) and 1.25 (010): to 010
  EXPECT_EQ(e4(std::nextafter(1.f + 1.f / 16, 2.f)), 0x39);
  EXPECT_EQ(e5(1.f + 1.f / 8), 0x3C);    // between 1 (00) and 1.25 (01)
  EXPECT_EQ(e5(1.f + 3.f / 8), 0x3E);    // between 1.25 (01) and 1.5 (10)
  // Subnormals: half the smallest one ties to zero (even), just above rounds up; 3/2 of it ties to 2.
  EXPECT_EQ(e4(std::ldexp(1.f, -10)), 0x00);
  EXPECT_EQ(e4(-std::ldexp(1.f, -10)), 0x80);
  EXPECT_EQ(e4(std::nextafter(std::ldexp(1.f, -10), 1.f)), 0x01);
  EXPECT_EQ(e4(3 * std::ldexp(1.f, -10)), 0x02);
  EXPECT_EQ(e5(std::ldexp(1.f, -17)), 0x00);
  EXPECT_EQ(e5(3 * std::ldexp(1.f, -17)), 0x02);
  EXPECT_EQ(e4(1e-30f), 0x00);
  EXPECT_EQ(e4(-0.f), 0x80);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(e4(std::ldexp(15.f, -10)), 0x08);
  // e4m3 saturation: 448 < |x| < 464 rounds to 448, 464 ties to the even 448, beyond overflows.
  EXPECT_EQ(e4(460.f), 0x7E);
  EXPECT_EQ(e4(464.f), 0x7E);
  EXPECT_EQ(e4(464.f, Fp8Overflow::nosat), 0x7E);
  EXPECT_EQ(e4(std::nextafter(464.f, 1e9f)), 0x7E);
  EXPECT_EQ(e4(std::nextafter(464.f, 1e9f), Fp8Overflow::nosat), 0x7F);
  EXPECT_EQ(e4(-1e6f), 0xFE);
  EXPECT_EQ(e4(-1e6f, Fp8Overflow::nosat), 0xFF);
  EXPECT_EQ(e4(inf), 0x7E);
  EXPECT_EQ(e4(-inf), 0xFE);
  EXPECT_EQ(e4(inf, Fp8Overflow::nosat), 0x7F);
  // e5m2: 61440 is the midpoint between 57344 and 65536 and ties to 65536 (even): overflow.
  EXPECT_EQ(e5(std::nextafter(61440.f, 0.f)), 0x7B);
  EXPECT_EQ(e5(61440.f), 0x7B);
  EXPECT_EQ(e5(61440.f, Fp8Overflow::nosat), 0x7C);
  EXPECT_EQ(e5(-inf), 0xFB);
  EXPECT_EQ(e5(-inf, Fp8Overflow::nosat), 0xFC);
  EXPECT_EQ(e5(3e38f, Fp8Overflow::nosat), 0x7C);
  // NaN of either sign and any payload: the canonical 0x7F.
  for (Fp8Format f : kFormats) {
    EXPECT_EQ(float_to_fp8(nan, f), 0x7F);
    EXPECT_EQ(float_to_fp8(-nan, f), 0x7F);
    EXPECT_EQ(float_to_fp8(std::bit_cast<float>(0xFF800001u), f), 0x7F);
  }
}

// The independent oracle: the nearest decoded finite value, ties to the even code; beyond the
// largest finite value the next value the format would have (max + its spacing) stands for
// "overflow", so the tie at the midpoint goes where round-to-nearest-even sends it.
struct Oracle {
  struct Entry {
    double value;
    int code;   // magnitude code; -1 = overflow
    bool even;
  };
  std::vector<Entry> entries;
  explicit Oracle(Fp8Format f) {
    for (int c = 0; c < 0x80; ++c) {
      const float v = fp8_to_float(static_cast<std::uint8_t>(c), f);
      if (std::isfinite(v)) entries.push_back({v, c, (c & 1) == 0});
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.value < b.value; });
    const double max = entries.back().value, spacing = max - entries[entries.size() - 2].value;
    const int next_code = entries.back().code + 1;   // 0x7F (odd) for e4m3, 0x7C (even) for e5m2
    entries.push_back({max + spacing, -1, (next_code & 1) == 0});
  }
  // Magnitude code of |x| (finite), or -1 for overflow.
  int round(double a) const {
    auto hi = std::lower_bound(entries.begin(), entries.end(), a,
                               [](const Entry& e, double v) { return e.value < v; });
    if (hi == entries.end()) return -1;
    if (hi->value == a || hi == entries.begin()) return hi->code;
    auto lo = hi - 1;
    const double dl = a - lo->value, dh = hi->value - a;
    if (dl < dh) return lo->code;
    if (dh < dl) return hi->code;
    return lo->even ? lo->code : hi->code;
  }
};

TEST(Fp8, MatchesNearestValueOracle) {
  std::mt19937_64 rng(20260427);
  for (Fp8Format f : kFormats) {
    SCOPED_TRACE(fp8_format_name(f));
    const Oracle oracle(f);
    std::vector<float> inputs;
    // Every decoded value, the midpoints between neighbours and one float either side of each.
    for (std::size_t i = 0; i + 1 < oracle.entries.size(); ++i) {
      const auto mid = static_cast<float>((oracle.entries[i].value + oracle.entries[i + 1].value) / 2);
      for (float v : {static_cast<float>(oracle.entries[i].value), mid, std::nextafter(mid, 0.f),
                      std::nextafter(mid, 1e30f)})
        inputs.push_back(v);
    }
    // Log-uniform magnitudes from well below the subnormals to well above the largest value.
    std::uniform_real_distribution<double> log2mag(-24.0, 20.0);
    for (int i = 0; i < 200000; ++i) inputs.push_back(static_cast<float>(std::exp2(log2mag(rng))));
    int failures = 0;
    for (float a : inputs)
      for (float x : {a, -a}) {
        const int want_mag = oracle.round(std::fabs(static_cast<double>(x)));
        const int sign = std::signbit(x) ? 0x80 : 0;
        const int want_sat = sign | (want_mag < 0 ? (f == Fp8Format::e4m3 ? 0x7E : 0x7B) : want_mag);
        const int want_nosat = sign | (want_mag < 0 ? (f == Fp8Format::e4m3 ? 0x7F : 0x7C) : want_mag);
        const int got_sat = float_to_fp8(x, f, Fp8Overflow::satfinite);
        const int got_nosat = float_to_fp8(x, f, Fp8Overflow::nosat);
        if ((got_sat != want_sat || got_nosat != want_nosat) && ++failures <= 10)
          ADD_FAILURE() << "x = " << x << " (" << std::hexfloat << x << std::defaultfloat << "): satfinite 0x"
                        << std::hex << got_sat << " want 0x" << want_sat << ", nosat 0x" << got_nosat << " want 0x"
                        << want_nosat;
      }
    EXPECT_EQ(failures, 0);
  }
}

}  // namespace
}  // namespace lmscale
