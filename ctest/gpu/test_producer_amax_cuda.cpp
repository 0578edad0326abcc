// Producer amaxes on CUDA (lmscale/ops/ops.h, docs/precision.md "Amaxes from the producers"):
// the amax each norm and SwiGLU kernel accumulates as it stores its output is bitwise ops::amax
// of that output (also a CUDA kernel, a separate pass), on random inputs in bf16 and fp32, over
// shapes that take every kernel path (vectorised rows, the register backward with one and two
// chunks per thread, the shared-memory backward, the scalar paths of rows not a multiple of 8,
// one row, partial blocks), with a NaN and an inf; and current scaling's cast from a producer
// amax against its two-pass quantize. Skipped (exit 77) without a GPU.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_scaling.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

class ProducerAmaxCuda : public CudaOpsTest {
 protected:
  // The slot before an op: garbage it must overwrite.
  Tensor slot() { return dev({1e30}, {1}, DType::f32); }
  std::uint32_t bits(const Tensor& scalar) {
    const float v = static_cast<float>(values(scalar)[0]);
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  }
  // amax (the producer's) against ops::amax of out on the device, bit for bit.
  void expect_amax_of(const Tensor& amax, const Tensor& out, const std::string& what) {
    Tensor ref = Tensor::empty({1}, DType::f32, gpu_.allocator(), "test_ref");
    ops::amax(g(), out, ref);
    const std::uint32_t got = bits(amax), want = bits(ref);
    EXPECT_EQ(got, want) << what << ": producer amax bits " << std::hex << got << ", ops::amax " << want << std::dec
                         << " (seed " << seed() << ")";
    EXPECT_NE(want, 0u) << what << ": an all-zero output tests nothing";
  }
  // n values of dtype t, normal(0, scale), with element `special` (when >= 0) set to v.
  std::vector<double> data(std::size_t n, DType t, double scale, std::int64_t special = -1, double v = 0) {
    std::vector<double> x = randn(n, t, scale);
    if (special >= 0) x[static_cast<std::size_t>(special)] = v;
    return x;
  }
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// d: 7 and 100 (scalar rows), 64, 1600 (xl's width: one chunk per thread), 4096 (two chunks per
// thread), 8192 (the shared-memory backward).
const std::vector<std::int64_t> kWidths = {7, 64, 100, 1600, 4096, 8192};
const std::vector<std::int64_t> kRows = {1, 37, 300};

TEST_F(ProducerAmaxCuda, NormsWriteTheirOutputsAmax) {
  for (DType t : {DType::bf16, DType::f32})
    for (std::int64_t d : kWidths)
      for (std::int64_t N : kRows) {
        const std::string at = std::string(dtype_name(t)) + " " + std::to_string(N) + " x " + std::to_string(d);
        const std::size_t n = static_cast<std::size_t>(N * d);
        const Tensor x = dev(data(n, t, 2.0), {N, d}, t), w = dev(data(static_cast<std::size_t>(d), t, 1.0), {d}, t);
        Tensor y = poisoned({N, d}, t), rstd = poisoned({N}, DType::f32), amax = slot();
        ops::rmsnorm(g(), x, w, 1e-5, y, rstd, &amax);
        expect_amax_of(amax, y, "rmsnorm " + at);
        const Tensor b = dev(data(n, t, 1.0), {N, d}, t);
        Tensor sum = poisoned({N, d}, t), y2 = poisoned({N, d}, t);
        ops::add_rmsnorm(g(), x, b, w, 1e-5, sum, y2, rstd, &amax);
        expect_amax_of(amax, y2, "add_rmsnorm " + at);
        const Tensor dy = dev(data(n, t, 1.0), {N, d}, t);
        for (bool accumulate : {false, true}) {
          Tensor dx = dev(data(n, t, 0.5), {N, d}, t), dw = dev(std::vector<double>(static_cast<std::size_t>(d), 0.0), {d}, t);
          ops::rmsnorm_backward(g(), x, w, rstd, dy, dx, dw, accumulate, &amax);
          expect_amax_of(amax, dx, std::string("rmsnorm_backward ") + (accumulate ? "accumulating " : "") + at);
        }
      }
}

TEST_F(ProducerAmaxCuda, NormsPropagateInfAndNaN) {
  for (DType t : {DType::bf16, DType::f32})
    for (std::int64_t d : {std::int64_t{100}, std::int64_t{1600}}) {
      const std::int64_t N = 37;
      const std::size_t n = static_cast<std::size_t>(N * d);
      const std::string at = std::string(dtype_name(t)) + " d " + std::to_string(d);
      std::vector<double> wv(static_cast<std::size_t>(d), 1.0);
      wv[3] = kInf;   // column 3 of y is +-inf
      const Tensor x = dev(data(n, t, 1.0), {N, d}, t);
      Tensor y = poisoned({N, d}, t), rstd = poisoned({N}, DType::f32), amax = slot();
      ops::rmsnorm(g(), x, dev(wv, {d}, t), 1e-5, y, rstd, &amax);
      expect_amax_of(amax, y, "rmsnorm, an inf weight, " + at);
      EXPECT_TRUE(std::isinf(values(amax)[0])) << at;
      const Tensor w = dev(std::vector<double>(static_cast<std::size_t>(d), 1.0), {d}, t);
      const Tensor x_inf = dev(data(n, t, 1.0, d * 5 + 2, kInf), {N, d}, t);   // row 5: inf * 0 = NaN
      ops::rmsnorm(g(), x_inf, w, 1e-5, y, rstd, &amax);
      expect_amax_of(amax, y, "rmsnorm, an inf input, " + at);
      EXPECT_TRUE(std::isnan(values(amax)[0])) << at;
      Tensor dx = poisoned({N, d}, t), dw = dev(std::vector<double>(static_cast<std::size_t>(d), 0.0), {d}, t);
      const Tensor dy = dev(data(n, t, 1.0, d * 7 + 1, kNaN), {N, d}, t);
      ops::rmsnorm_backward(g(), x, w, rstd, dy, dx, dw, false, &amax);
      expect_amax_of(amax, dx, "rmsnorm_backward, a NaN dy, " + at);
      EXPECT_TRUE(std::isnan(values(amax)[0])) << at;
    }
}

TEST_F(ProducerAmaxCuda, SwigluWritesItsOutputsAmax) {
  // The model's layout: a|b side by side [rows, 2F] (ld = 2F), h and dh contiguous [rows, F]; F 13
  // takes the scalar path, 6400 is xl's d_ff; ld == F (one contiguous block) too.
  for (DType t : {DType::bf16, DType::f32})
    for (std::int64_t F : {std::int64_t{13}, std::int64_t{64}, std::int64_t{6400}})
      for (std::int64_t rows : {std::int64_t{1}, std::int64_t{37}, std::int64_t{300}})
        for (bool side_by_side : {true, false}) {
          const std::int64_t ld = side_by_side ? 2 * F : F, extent = (rows - 1) * ld + F;
          const std::string at = std::string(dtype_name(t)) + " " + std::to_string(rows) + " x " + std::to_string(F) +
                                 (side_by_side ? " in a|b" : " contiguous");
          const std::size_t n = static_cast<std::size_t>(side_by_side ? rows * 2 * F : 2 * rows * F);
          const Tensor ab = dev(data(n, t, 2.0), {static_cast<std::int64_t>(n)}, t);
          const Tensor a = ab.flat_range(0, extent), b = ab.flat_range(side_by_side ? F : rows * F, extent);
          Tensor h = poisoned({rows, F}, t), amax = slot();
          ops::swiglu_rows(g(), a, b, rows, F, ld, h, &amax);
          expect_amax_of(amax, h, "swiglu_rows " + at);
          const Tensor dh = dev(data(static_cast<std::size_t>(rows * F), t, 1.0), {rows, F}, t);
          Tensor dab = poisoned({static_cast<std::int64_t>(n)}, t);
          Tensor da = dab.flat_range(0, extent), db = dab.flat_range(side_by_side ? F : rows * F, extent);
          ops::swiglu_rows_backward(g(), a, b, rows, F, ld, dh, da, db, &amax);
          expect_amax_of(amax, dab, "swiglu_rows_backward " + at);
        }
}

TEST_F(ProducerAmaxCuda, SwigluPropagatesInfAndNaN) {
  for (DType t : {DType::bf16, DType::f32})
    for (double bad : {kInf, kNaN}) {
      const std::int64_t rows = 37, F = 64;
      std::vector<double> v = data(static_cast<std::size_t>(rows * 2 * F), t, 1.0);
      v[static_cast<std::size_t>(5 * 2 * F + 3)] = 1.0;        // a[5][3] > 0
      v[static_cast<std::size_t>(5 * 2 * F + F + 3)] = bad;    // b[5][3]: h[5][3] = bad
      const Tensor ab = dev(v, {rows, 2 * F}, t);
      const Tensor a = ab.flat_range(0, (rows - 1) * 2 * F + F), b = ab.flat_range(F, (rows - 1) * 2 * F + F);
      Tensor h = poisoned({rows, F}, t), amax = slot();
      ops::swiglu_rows(g(), a, b, rows, F, 2 * F, h, &amax);
      expect_amax_of(amax, h, std::string("swiglu_rows with ") + (std::isnan(bad) ? "NaN" : "inf"));
      EXPECT_EQ(std::isnan(values(amax)[0]), std::isnan(bad));
      const Tensor dh = dev(data(static_cast<std::size_t>(rows * F), t, 1.0), {rows, F}, t);
      Tensor dab = poisoned({rows, 2 * F}, t);
      Tensor da = dab.flat_range(0, (rows - 1) * 2 * F + F), db = dab.flat_range(F, (rows - 1) * 2 * F + F);
      ops::swiglu_rows_backward(g(), a, b, rows, F, 2 * F, dh, da, db, &amax);
      expect_amax_of(amax, dab, "swiglu_rows_backward with a non-finite b");
      EXPECT_FALSE(std::isfinite(values(amax)[0]));
    }
}

// Current scaling's cast from a producer amax (the norm's) against the two-pass quantize of the
// same tensor: the same bytes, transpose, scale, inverse and history, over a few shapes (whole
// and partial 64 x 64 tiles) and formats.
TEST_F(ProducerAmaxCuda, CastFromAProducerAmaxIsTheTwoPassQuantize) {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (auto [N, d] : std::vector<std::pair<std::int64_t, std::int64_t>>{{64, 64}, {100, 72}, {2048, 1600}, {37, 100}}) {
      const std::string at = std::to_string(N) + " x " + std::to_string(d);
      const std::size_t n = static_cast<std::size_t>(N * d);
      const Tensor x = dev(data(n, DType::bf16, 3.0), {N, d}, DType::bf16);
      const Tensor w = dev(data(static_cast<std::size_t>(d), DType::bf16, 1.0), {d}, DType::bf16);
      Tensor y = poisoned({N, d}, DType::bf16), rstd = poisoned({N}, DType::f32);
      ops::Fp8TensorScaling measured(g(), f, ops::Fp8Recipe::current, 1, 0), fused(g(), f, ops::Fp8Recipe::current, 1, 0);
      Tensor slot = fused.producer_amax();
      ops::rmsnorm(g(), x, w, 1e-5, y, rstd, &slot);
      const DType q = fp8_dtype(f);
      Tensor q1 = Tensor::empty({N, d}, q, gpu_.allocator()), qt1 = Tensor::empty({d, N}, q, gpu_.allocator());
      Tensor q2 = Tensor::empty({N, d}, q, gpu_.allocator()), qt2 = Tensor::empty({d, N}, q, gpu_.allocator());
      measured.quantize(g(), y, &q1, &qt1);
      fused.quantize(g(), y, &q2, &qt2, true, ops::Fp8Amax::from_producer);
      auto raw = [&](const Tensor& t) {
        std::vector<std::uint8_t> v(t.nbytes());
        EXPECT_EQ(cudaMemcpy(v.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
        return v;
      };
      EXPECT_EQ(raw(q2), raw(q1)) << at;
      EXPECT_EQ(raw(qt2), raw(qt1)) << at;
      EXPECT_EQ(raw(fused.scale()), raw(measured.scale())) << at;
      EXPECT_EQ(raw(fused.inv_scale()), raw(measured.inv_scale())) << at;
      EXPECT_EQ(raw(fused.amax_history()), raw(measured.amax_history())) << at;
      EXPECT_NE(values(fused.scale())[0], 1.0) << at << ": the scale was never set";
    }
}

}  // namespace
}  // namespace lmscale::test
