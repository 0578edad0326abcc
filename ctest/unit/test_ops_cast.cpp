// ops::cast on the CPU: fp32/fp64 <-> bf16/fp16 with round-to-nearest-even ties, overflow,
// inf, nan, subnormals, no double rounding from fp64, exhaustive 16-bit round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ops_test_util.h"

namespace lmscale::test {
namespace {

class Casts : public OpsTest {
 protected:
  // Casts a list of floats (or doubles) to a 16-bit dtype and returns the bit patterns.
  template <class Src>
  std::vector<std::uint16_t> to16(const std::vector<Src>& xs, DType dst_dtype) {
    const DType src_dtype = std::is_same_v<Src, double> ? DType::f64 : DType::f32;
    const auto n = static_cast<std::int64_t>(xs.size());
    Tensor src = Tensor::view(const_cast<Src*>(xs.data()), {n}, src_dtype, Device::cpu);
    Tensor dst = Tensor::empty({n}, dst_dtype, alloc, "test");
    std::memset(dst.data(), 0xAB, dst.nbytes());
    ops::cast(ctx, src, dst);
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    std::memcpy(bits.data(), dst.data(), dst.nbytes());
    return bits;
  }
};

const float kInf = std::numeric_limits<float>::infinity();

TEST_F(Casts, Bf16RoundsToNearestEven) {
  const std::vector<float> xs = {
      1.0f,
      1.0f + std::ldexp(1.0f, -8),                          // tie between 0x3F80 (even) and 0x3F81
      1.0f + 3 * std::ldexp(1.0f, -8),                      // tie between 0x3F81 and 0x3F82 (even)
      1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20),  // just above the tie
      -2.5f,
      kInf, -kInf,
      std::ldexp(1.0f, -130),                               // fp32 subnormal = 8 * 2^-133 (bf16 subnormal)
      0.0f, -0.0f,
      std::numeric_limits<float>::max(),                    // rounds past bf16 max to inf
  };
  const std::vector<std::uint16_t> want = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x7F80,
                                           0xFF80, 0x0008, 0x0000, 0x8000, 0x7F80};
  EXPECT_EQ(to16(xs, DType::bf16), want);
  const auto nan_bits = to16(std::vector<float>{std::nanf("")}, DType::bf16)[0];
  EXPECT_EQ(nan_bits & 0x7F80, 0x7F80);
  EXPECT_NE(nan_bits & 0x007F, 0) << "nan must stay nan";
}

TEST_F(Casts, Fp16RoundsToNearestEven) {
  const std::vector<float> xs = {
      1.0f,
      1.0f + std::ldexp(1.0f, -11),      // tie -> 0x3C00 (even)
      1.0f + 3 * std::ldexp(1.0f, -11),  // tie -> 0x3C02 (even)
      65504.0f,                          // max half
      65519.0f,                          // below the tie with 65536: stays max
      65520.0f,                          // tie between 65504 (odd mantissa) and inf: inf
      kInf, -kInf,
      std::ldexp(1.0f, -14),             // smallest normal
      std::ldexp(1.0f, -24),             // smallest subnormal
      std::ldexp(1.0f, -25),             // tie between 0 and 2^-24: 0 (even)
      3 * std::ldexp(1.0f, -26),         // 0.75 * 2^-24: rounds up to 2^-24
      3 * std::ldexp(1.0f, -25),         // 1.5 * 2^-24: tie -> 2 * 2^-24 (even)
      -0.0f,
  };
  const std::vector<std::uint16_t> want = {0x3C00, 0x3C00, 0x3C02, 0x7BFF, 0x7BFF, 0x7C00, 0x7C00,
                                           0xFC00, 0x0400, 0x0001, 0x0000, 0x0001, 0x0002, 0x8000};
  EXPECT_EQ(to16(xs, DType::f16), want);
  const auto nan_bits = to16(std::vector<float>{std::nanf("")}, DType::f16)[0];
  EXPECT_EQ(nan_bits & 0x7C00, 0x7C00);
  EXPECT_NE(nan_bits & 0x03FF, 0);
}

TEST_F(Casts, Fp64ToSixteenBitRoundsOnce) {
  // 1 + 2^-8 + 2^-40 lies just above the bf16 tie; through fp32 it would land on the tie and round
  // down to 1.0. One correct rounding gives 0x3F81. Likewise for fp16 at 1 + 2^-11 + 2^-40.
  const std::vector<double> xs = {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40),
                                  1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -40), 1.0 + std::ldexp(1.0, -8),
                                  1e300, -1e-300};
  EXPECT_EQ(to16(xs, DType::bf16), (std::vector<std::uint16_t>{0x3F81, 0x3F80, 0x3F80, 0x7F80, 0x8000}));
  const std::vector<double> ys = {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
                                  1.0 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40), 1.0 + std::ldexp(1.0, -11),
                                  1e300, -1e-300};
  EXPECT_EQ(to16(ys, DType::f16), (std::vector<std::uint16_t>{0x3C01, 0x3C00, 0x3C00, 0x7C00, 0x8000}));
}

// Every 16-bit pattern survives 16 -> fp32 -> 16 and 16 -> fp64 -> 16 (NaNs stay NaN).
void round_trip_all(Context& ctx, HostAllocator& alloc, DType dt16, std::uint16_t exp_mask,
                    std::uint16_t man_mask) {
  Tensor all = Tensor::empty({65536}, dt16, alloc, "test");
  for (std::uint32_t i = 0; i < 65536; ++i) all.data_as<std::uint16_t>()[i] = static_cast<std::uint16_t>(i);
  for (DType wide : {DType::f32, DType::f64}) {
    Tensor w = Tensor::empty({65536}, wide, alloc, "test"), back = Tensor::empty({65536}, dt16, alloc, "test");
    ops::cast(ctx, all, w);
    ops::cast(ctx, w, back);
    int mismatches = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const std::uint16_t b = back.data_as<std::uint16_t>()[i];
      const bool is_nan = (i & exp_mask) == exp_mask && (i & man_mask);
      if (is_nan ? !((b & exp_mask) == exp_mask && (b & man_mask)) : b != i) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(dt16) << " via " << dtype_name(wide);
  }
}

TEST_F(Casts, Bf16RoundTripsExactly) { round_trip_all(ctx, alloc, DType::bf16, 0x7F80, 0x007F); }
TEST_F(Casts, Fp16RoundTripsExactly) { round_trip_all(ctx, alloc, DType::f16, 0x7C00, 0x03FF); }

TEST_F(Casts, Fp16ToFp32Values) {
  Tensor h = Tensor::empty({4}, DType::f16, alloc, "test");
  const std::uint16_t bits[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
  std::memcpy(h.data(), bits, 8);
  Tensor f = poisoned({4}, DType::f32);
  ops::cast(ctx, h, f);
  EXPECT_EQ(values(f), (std::vector<double>{1.0, -2.0, std::ldexp(1.0, -24), 65504.0}));
}

TEST_F(Casts, Fp32Fp64RoundTripAndSameDtypeCopy) {
  Tensor x = randn({100}, 1, 1e3, 0.0, DType::f32), d = poisoned({100}), back = poisoned({100}, DType::f32);
  ops::cast(ctx, x, d);
  ops::cast(ctx, d, back);
  EXPECT_EQ(std::memcmp(x.data(), back.data(), x.nbytes()), 0);
  Tensor same = poisoned({10, 10}, DType::f32);
  ops::cast(ctx, x, same);
  EXPECT_EQ(std::memcmp(x.data(), same.data(), x.nbytes()), 0);
}

TEST_F(Casts, BadArgumentsThrow) {
  Tensor x = randn({4}, 2), y = poisoned({5});
  EXPECT_THROW(ops::cast(ctx, x, y), Error);   // count
  Tensor i = ids({4}, {1, 2, 3, 4});
  EXPECT_THROW(ops::cast(ctx, x, i), Error);   // not floating
  EXPECT_THROW(ops::cast(ctx, i, x), Error);
}

}  // namespace
}  // namespace lmscale::test
