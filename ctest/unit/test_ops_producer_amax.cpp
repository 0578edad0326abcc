// Producer amaxes on the CPU (lmscale/ops/ops.h, docs/precision.md "Amaxes from the producers"):
// the amax each norm and SwiGLU op writes for its output is bitwise ops::amax of that output, in
// fp32 and fp64, with NaN and inf outputs, over only the elements written (a strided da|db), and
// overwrites whatever the slot held; and current scaling's cast from a producer amax leaves
// bitwise the outputs and state of its two-pass quantize.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "lmscale/core/error.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_scaling.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::uint32_t bits(const Tensor& scalar) {
  std::uint32_t u;
  std::memcpy(&u, scalar.data(), 4);
  return u;
}
float value(const Tensor& scalar) { return scalar.data_as<float>()[0]; }

class ProducerAmaxTest : public OpsTest, public ::testing::WithParamInterface<DType> {
 protected:
  // A slot holding garbage: the op must overwrite it, not take a maximum with it.
  Tensor slot() { return full({1}, 1e30, DType::f32); }
  // ops::amax of t: the reference.
  Tensor reference(const Tensor& t) {
    Tensor r = Tensor::empty({1}, DType::f32, alloc, "test");
    ops::amax(ctx, t, r);
    return r;
  }
  void expect_amax_of(const Tensor& amax, const Tensor& out, const std::string& what) {
    const Tensor ref = reference(out);
    EXPECT_EQ(bits(amax), bits(ref)) << what << ": amax " << value(amax) << ", ops::amax " << value(ref);
  }
  DType t() const { return GetParam(); }
};

TEST_P(ProducerAmaxTest, NormsWriteTheirOutputsAmax) {
  const std::int64_t N = 5, d = 12;
  const Tensor x = randn({N, d}, 1, 3.0, 0.0, t()), w = randn({d}, 2, 1.0, 0.0, t());
  Tensor y = poisoned({N, d}, t()), rstd = poisoned({N}, t()), amax = slot();
  ops::rmsnorm(ctx, x, w, 1e-5, y, rstd, &amax);
  expect_amax_of(amax, y, "rmsnorm");
  EXPECT_GT(value(amax), 0.f);

  const Tensor b = randn({N, d}, 3, 2.0, 0.0, t());
  Tensor sum = poisoned({N, d}, t()), y2 = poisoned({N, d}, t()), amax2 = slot();
  ops::add_rmsnorm(ctx, x, b, w, 1e-5, sum, y2, rstd, &amax2);
  expect_amax_of(amax2, y2, "add_rmsnorm");

  const Tensor dy = randn({N, d}, 4, 1.0, 0.0, t());
  for (bool accumulate : {false, true}) {
    Tensor dx = randn({N, d}, 5, 50.0, 0.0, t()), dw = zeros({d}, t()), amax3 = slot();
    ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw, accumulate, &amax3);
    expect_amax_of(amax3, dx, accumulate ? "rmsnorm_backward accumulating" : "rmsnorm_backward");
    // Accumulating onto a residual gradient 50x larger: its amax is the sum's, not the norm's.
    if (accumulate) {
      EXPECT_GT(value(amax3), 10.f);
    }
  }
}

TEST_P(ProducerAmaxTest, NormsPropagateInfAndNaN) {
  const std::int64_t N = 3, d = 8;
  Tensor x = randn({N, d}, 6, 1.0, 0.0, t()), w = randn({d}, 7, 1.0, 0.0, t());
  Tensor y = poisoned({N, d}, t()), rstd = poisoned({N}, t()), amax = slot();
  ops::fill(ctx, w, 1.0);
  Tensor w_inf = clone(w);
  if (t() == DType::f32) {
    w_inf.data_as<float>()[3] = std::numeric_limits<float>::infinity();
  } else {
    w_inf.data_as<double>()[3] = kInf;
  }
  ops::rmsnorm(ctx, x, w_inf, 1e-5, y, rstd, &amax);   // column 3 is +-inf (x is never 0 here)
  expect_amax_of(amax, y, "rmsnorm, an inf weight");
  EXPECT_TRUE(std::isinf(value(amax)));
  if (t() == DType::f32) {
    x.data_as<float>()[d + 1] = std::numeric_limits<float>::infinity();
  } else {
    x.data_as<double>()[d + 1] = kInf;
  }
  ops::rmsnorm(ctx, x, w, 1e-5, y, rstd, &amax);   // row 1: inf * rstd 0 = NaN
  expect_amax_of(amax, y, "rmsnorm, an inf input");
  EXPECT_TRUE(std::isnan(value(amax)));
  Tensor dx = poisoned({N, d}, t()), dw = zeros({d}, t()), dy = randn({N, d}, 8, 1.0, 0.0, t());
  ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw, false, &amax);
  expect_amax_of(amax, dx, "rmsnorm_backward, NaN rows");
  EXPECT_TRUE(std::isnan(value(amax)));
}

TEST_P(ProducerAmaxTest, SwigluWritesItsOutputsAmax) {
  // The model's layout: a|b side by side in [rows, 2F] (ld = 2F); h contiguous [rows, F].
  const std::int64_t rows = 4, F = 6;
  Tensor ab = randn({rows, 2 * F}, 9, 2.0, 0.0, t());
  const Tensor a = ab.flat_range(0, (rows - 1) * 2 * F + F), b = ab.flat_range(F, (rows - 1) * 2 * F + F);
  Tensor h = poisoned({rows, F}, t()), amax = slot();
  ops::swiglu_rows(ctx, a, b, rows, F, 2 * F, h, &amax);
  expect_amax_of(amax, h, "swiglu_rows");
  const Tensor dh = randn({rows, F}, 10, 1.0, 0.0, t());
  Tensor dab = poisoned({rows, 2 * F}, t());
  Tensor da = dab.flat_range(0, (rows - 1) * 2 * F + F), db = dab.flat_range(F, (rows - 1) * 2 * F + F);
  ops::swiglu_rows_backward(ctx, a, b, rows, F, 2 * F, dh, da, db, &amax);
  expect_amax_of(amax, dab, "swiglu_rows_backward (da|db)");
  // Only the written elements count: rows of ld = 2F + 3 whose 3 gap columns hold 1e6.
  const std::int64_t ld = 2 * F + 3;
  Tensor wide = full({rows, ld}, 1e6, t());
  Tensor wa = wide.flat_range(0, (rows - 1) * ld + F), wb = wide.flat_range(F, (rows - 1) * ld + F);
  for (std::int64_t r = 0; r < rows; ++r)   // a|b's rows into the wide rows, gaps left at 1e6
    for (std::int64_t c = 0; c < 2 * F; ++c) {
      if (t() == DType::f32) wide.data_as<float>()[r * ld + c] = ab.data_as<float>()[r * 2 * F + c];
      else wide.data_as<double>()[r * ld + c] = ab.data_as<double>()[r * 2 * F + c];
    }
  Tensor again = slot();
  ops::swiglu_rows_backward(ctx, wa, wb, rows, F, ld, dh, wa, wb, &again);   // in place, gaps untouched
  EXPECT_LT(value(again), 1e6f) << "the gap columns were counted";
  for (std::int64_t r = 0; r < rows; ++r) {
    Tensor gap = wide.flat_range(r * ld + 2 * F, 3);
    ops::fill(ctx, gap, 0.0);
  }
  expect_amax_of(again, wide, "swiglu_rows_backward with gaps");
}

TEST_P(ProducerAmaxTest, SwigluPropagatesInfAndNaN) {
  const std::int64_t rows = 2, F = 4;
  for (double bad : {kInf, kNaN}) {
    Tensor ab = randn({rows, 2 * F}, 11, 1.0, 0.0, t());
    if (t() == DType::f32) {
      ab.data_as<float>()[F + 1] = static_cast<float>(bad);   // b[0][1]
      ab.data_as<float>()[1] = 1.f;                           // a[0][1] > 0: silu(a) b = +-bad
    } else {
      ab.data_as<double>()[F + 1] = bad;
      ab.data_as<double>()[1] = 1.0;
    }
    const Tensor a = ab.flat_range(0, (rows - 1) * 2 * F + F), b = ab.flat_range(F, (rows - 1) * 2 * F + F);
    Tensor h = poisoned({rows, F}, t()), amax = slot();
    ops::swiglu_rows(ctx, a, b, rows, F, 2 * F, h, &amax);
    expect_amax_of(amax, h, std::isnan(bad) ? "swiglu NaN" : "swiglu inf");
    EXPECT_EQ(std::isnan(value(amax)), std::isnan(bad));
    EXPECT_TRUE(!std::isfinite(value(amax)));
    const Tensor dh = randn({rows, F}, 12, 1.0, 0.0, t());
    Tensor dab = poisoned({rows, 2 * F}, t());
    Tensor da = dab.flat_range(0, (rows - 1) * 2 * F + F), db = dab.flat_range(F, (rows - 1) * 2 * F + F);
    ops::swiglu_rows_backward(ctx, a, b, rows, F, 2 * F, dh, da, db, &amax);
    expect_amax_of(amax, dab, "swiglu backward, a non-finite b");
    EXPECT_TRUE(!std::isfinite(value(amax)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ProducerAmaxTest, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

TEST_F(OpsTest, ProducerAmaxMustBeOneFp32Element) {
  const Tensor x = randn({2, 4}, 1), w = randn({4}, 2);
  Tensor y = poisoned({2, 4}), rstd = poisoned({2});
  Tensor two = zeros({2}, DType::f32), f64 = zeros({1}, DType::f64);
  EXPECT_THROW(ops::rmsnorm(ctx, x, w, 1e-5, y, rstd, &two), Error);
  EXPECT_THROW(ops::rmsnorm(ctx, x, w, 1e-5, y, rstd, &f64), Error);
}

// Current scaling's cast from a producer amax against its two-pass quantize: the same fp8 bytes,
// transpose, scale, inverse and history, for ordinary data, an all-zero tensor (amax 0: the scale
// is kept), and tensors holding inf or NaN (the scale is kept too).
TEST_F(OpsTest, CastFromAProducerAmaxIsTheTwoPassQuantize) {
  const std::int64_t M = 6, K = 10;
  for (const std::string& kind : {std::string("normal"), std::string("zero"), std::string("inf"), std::string("nan")}) {
    Tensor x = randn({M, K}, 13, 40.0, 0.0, DType::f32);
    if (kind == "zero") ops::fill(ctx, x, 0.0);
    if (kind == "inf") {
      x.data_as<float>()[7] = std::numeric_limits<float>::infinity();
    }
    if (kind == "nan") {
      x.data_as<float>()[7] = std::numeric_limits<float>::quiet_NaN();
    }
    ops::Fp8TensorScaling measured(ctx, Fp8Format::e4m3, ops::Fp8Recipe::current, 1, 1);
    ops::Fp8TensorScaling fused(ctx, Fp8Format::e4m3, ops::Fp8Recipe::current, 1, 1);
    // A first cast of other data leaves a non-1 scale, so "kept" is visible.
    const Tensor warm = randn({M, K}, 14, 0.01, 0.0, DType::f32);
    Tensor q = Tensor::empty({M, K}, DType::e4m3, alloc), qt = Tensor::empty({K, M}, DType::e4m3, alloc);
    measured.quantize(ctx, warm, &q, &qt);
    fused.quantize(ctx, warm, &q, &qt);
    Tensor q1 = Tensor::empty({M, K}, DType::e4m3, alloc), qt1 = Tensor::empty({K, M}, DType::e4m3, alloc);
    Tensor q2 = Tensor::empty({M, K}, DType::e4m3, alloc), qt2 = Tensor::empty({K, M}, DType::e4m3, alloc);
    measured.quantize(ctx, x, &q1, &qt1);
    Tensor slot = fused.producer_amax();
    ops::amax(ctx, x, slot);   // what a producer writes
    fused.quantize(ctx, x, &q2, &qt2, true, ops::Fp8Amax::from_producer);
    EXPECT_EQ(0, std::memcmp(q1.data(), q2.data(), M * K)) << kind;
    EXPECT_EQ(0, std::memcmp(qt1.data(), qt2.data(), M * K)) << kind;
    EXPECT_EQ(bits(measured.scale()), bits(fused.scale())) << kind;
    EXPECT_EQ(bits(measured.inv_scale()), bits(fused.inv_scale())) << kind;
    EXPECT_EQ(bits(measured.amax_history()), bits(fused.amax_history())) << kind;
    if (kind != "normal") {
      EXPECT_NE(value(fused.scale()), 1.f) << kind << ": the warm-up's scale was not kept";
    }
  }
}

TEST_F(OpsTest, CastFromAProducerAmaxIsRefusedWithoutItsSlot) {
  const Tensor x = randn({4, 4}, 15, 1.0, 0.0, DType::f32);
  Tensor q = Tensor::empty({4, 4}, DType::e4m3, alloc);
  ops::Fp8TensorScaling current(ctx, Fp8Format::e4m3, ops::Fp8Recipe::current, 1, 0);
  EXPECT_THROW(current.quantize(ctx, x, &q, nullptr, true, ops::Fp8Amax::from_producer), Error);
  current.producer_amax();
  EXPECT_NO_THROW(current.quantize(ctx, x, &q, nullptr, true, ops::Fp8Amax::from_producer));
  EXPECT_THROW(current.quantize(ctx, x, &q, nullptr, true, ops::Fp8Amax::from_producer), Error)
      << "one producer amax served two casts";
  ops::Fp8TensorScaling delayed(ctx, Fp8Format::e4m3, ops::Fp8Recipe::delayed, 4, 0);
  EXPECT_THROW(delayed.producer_amax(), Error);
}

}  // namespace
}  // namespace lmscale::test
