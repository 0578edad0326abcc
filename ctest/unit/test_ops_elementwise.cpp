// ops::fill, add, scale, copy, sum_squares, check_finite on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using ElementwiseTest = OpsTest;

TEST_F(ElementwiseTest, FillEveryDtype) {
  for (DType t : {DType::f32, DType::f64}) {
    Tensor x = poisoned({3, 4}, t);
    ops::fill(ctx, x, -1.25);
    for (double v : values(x)) EXPECT_EQ(v, -1.25);
  }
  Tensor b = Tensor::empty({5}, DType::bf16, alloc, "test");
  ops::fill(ctx, b, 1.0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b.data_as<std::uint16_t>()[i], 0x3F80);
  Tensor h = Tensor::empty({5}, DType::f16, alloc, "test");
  ops::fill(ctx, h, -2.0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.data_as<std::uint16_t>()[i], 0xC000);
  Tensor i32 = Tensor::empty({7}, DType::i32, alloc, "test");
  ops::fill(ctx, i32, 3.0);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(i32.data_as<std::int32_t>()[i], 3);
}

TEST_F(ElementwiseTest, AddIncludingAliasedOutput) {
  Tensor a = randn({4, 5}, 1), b = randn({20}, 2), out = poisoned({2, 10});
  ops::add(ctx, a, b, out);
  const auto av = values(a), bv = values(b), ov = values(out);
  for (std::size_t i = 0; i < av.size(); ++i) EXPECT_EQ(ov[i], av[i] + bv[i]);
  ops::add(ctx, a, b, a);   // out aliases a
  EXPECT_EQ(values(a), ov);
  Tensor a32 = as(b, DType::f32), b32 = as(b, DType::f32);
  ops::add(ctx, a32, b32, a32);
  for (std::size_t i = 0; i < bv.size(); ++i) EXPECT_EQ(values(a32)[i], static_cast<double>(static_cast<float>(bv[i]) * 2));
}

TEST_F(ElementwiseTest, Scale) {
  Tensor x = randn({9}, 3), ref = clone(x);
  ops::scale(ctx, x, -0.5);
  const auto xv = values(x), rv = values(ref);
  for (std::size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(xv[i], -0.5 * rv[i]);
  Tensor h = as(ref, DType::bf16), back = poisoned({9});
  ops::scale(ctx, h, 2.0);   // exact in bf16
  ops::cast(ctx, h, back);
  Tensor h0 = as(ref, DType::bf16), back0 = poisoned({9});
  ops::cast(ctx, h0, back0);
  for (std::size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(values(back)[i], 2.0 * values(back0)[i]);
}

TEST_F(ElementwiseTest, CopyHostToHost) {
  Tensor x = randn({3, 3}, 4), y = poisoned({9});
  ops::copy(ctx, x, y);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0);
  Tensor y32 = poisoned({9}, DType::f32);
  EXPECT_THROW(ops::copy(ctx, x, y32), Error);   // copy does not convert
  Tensor y8 = poisoned({8});
  EXPECT_THROW(ops::copy(ctx, x, y8), Error);
}

TEST_F(ElementwiseTest, SumSquaresAccumulatesInDouble) {
  // 1e4^2 + 1000 * 1^2: an fp32 running sum would drop every 1 (ulp(1e8) = 8).
  Tensor x = full({1001}, 1.0, DType::f32);
  x.data_as<float>()[0] = 1e4f;
  Tensor out = poisoned({1});
  ops::sum_squares(ctx, x, out);
  EXPECT_EQ(out.data_as<double>()[0], 1e8 + 1000.0);
  Tensor out32 = poisoned({1}, DType::f32);
  ops::sum_squares(ctx, x, out32);
  EXPECT_EQ(out32.data_as<float>()[0], static_cast<float>(1e8 + 1000.0));
  // fp64 and bf16 inputs, against a plain loop.
  Tensor y = randn({37}, 5);
  double want = 0;
  for (double v : values(y)) want += v * v;
  ops::sum_squares(ctx, y, out);
  EXPECT_NEAR(out.data_as<double>()[0], want, 1e-13 * want);
  Tensor yb = as(y, DType::bf16), yb64 = poisoned({37});
  ops::cast(ctx, yb, yb64);
  double want_b = 0;
  for (double v : values(yb64)) want_b += v * v;
  ops::sum_squares(ctx, yb, out);
  EXPECT_NEAR(out.data_as<double>()[0], want_b, 1e-13 * want_b);
  Tensor out_i = ids({1}, {0});
  EXPECT_THROW(ops::sum_squares(ctx, y, out_i), Error);
  Tensor out2 = poisoned({2});
  EXPECT_THROW(ops::sum_squares(ctx, y, out2), Error);
}

TEST_F(ElementwiseTest, CheckFinite) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    Tensor clean = as(randn({50}, 6), t), flag = ids({1}, {0});
    ops::check_finite(ctx, clean, flag);
    EXPECT_EQ(flag.data_as<std::int32_t>()[0], 0) << dtype_name(t);
    for (double bad : {inf, -inf, nan}) {
      for (std::int64_t pos : {0, 23, 49}) {
        Tensor x64 = randn({50}, 6);
        x64.data_as<double>()[pos] = bad;
        Tensor x = as(x64, t), f = ids({1}, {0});
        ops::check_finite(ctx, x, f);
        EXPECT_EQ(f.data_as<std::int32_t>()[0], 1) << dtype_name(t) << " " << bad << " at " << pos;
      }
    }
    // A set flag is left set by a clean tensor.
    Tensor set = ids({1}, {1});
    ops::check_finite(ctx, clean, set);
    EXPECT_EQ(set.data_as<std::int32_t>()[0], 1);
  }
  // fp16 overflow: 1e5 is finite in fp64 but inf after the cast, and check_finite sees it.
  Tensor big = full({3}, 1e5), big16 = as(big, DType::f16), flag = ids({1}, {0});
  ops::check_finite(ctx, big16, flag);
  EXPECT_EQ(flag.data_as<std::int32_t>()[0], 1);
  Tensor x = randn({3}, 7), flag_f = poisoned({1});
  EXPECT_THROW(ops::check_finite(ctx, x, flag_f), Error);   // flag must be int32
}

TEST_F(ElementwiseTest, MismatchedArgumentsThrow) {
  Tensor a = randn({4}, 8), b = randn({5}, 9), out = poisoned({4});
  EXPECT_THROW(ops::add(ctx, a, b, out), Error);
  Tensor b32 = randn({4}, 10, 1.0, 0.0, DType::f32);
  EXPECT_THROW(ops::add(ctx, a, b32, out), Error);
  Tensor i = ids({4}, {1, 2, 3, 4});
  EXPECT_THROW(ops::scale(ctx, i, 2.0), Error);
}

}  // namespace
}  // namespace lmscale::test
