// The FP8 ops on CUDA against their CPU references (lmscale/ops/fp8.h): the cast (the hardware's
// cvt.rn.satfinite against core/fp8.h's conversion, bit for bit, over a sweep of every float
// exponent with the rounding-relevant mantissa bits and over specials), amax, the transpose, the
// scale rule and the recipes bitwise.
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>
#include <limits>
#include <random>
#include <vector>

#include "lmscale/core/fp8.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_scaling.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

const DType kInputs[] = {DType::f32, DType::bf16, DType::f16};
const DType kFp8[] = {DType::e4m3, DType::e5m2};

class CudaFp8Test : public CudaOpsTest {
 protected:
  // The bytes of any tensor (host or device).
  std::vector<std::uint8_t> bytes(const Tensor& t) {
    Tensor h = Tensor::empty(t.shape(), t.dtype(), cpu_.host(), "test_host");
    ops::copy(t.device() == Device::cuda ? g() : c(), t, h);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    const auto* p = static_cast<const std::uint8_t*>(h.data());
    return {p, p + h.nbytes()};
  }
  Tensor to_device(const Tensor& h) {
    Tensor d = Tensor::empty(h.shape(), h.dtype(), gpu_.allocator(), "test_dev");
    ops::copy(g(), h, d);
    return d;
  }
  Tensor host_f32(const std::vector<float>& v) {
    Tensor h = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::f32, cpu_.host(), "test_host");
    std::memcpy(h.data(), v.data(), v.size() * 4);
    return h;
  }
  Tensor host_codes(const Shape& s, DType t) { return Tensor::empty(s, t, cpu_.host(), "test_host"); }
  Tensor dev_codes(const Shape& s, DType t) {
    Tensor d = Tensor::empty(s, t, gpu_.allocator(), "test_dev");
    poison(d);
    return d;
  }
  std::mt19937_64 gen{1234};
};

// Reports the first differing bytes (index, got, want) and the count.
void expect_same_bytes(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want,
                       const std::vector<float>* inputs = nullptr) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t diffs = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++diffs <= 8) {
      ::testing::Message m;
      m << "byte " << i << ": gpu 0x" << std::hex << int(got[i]) << ", cpu 0x" << int(want[i]);
      if (inputs && i < inputs->size())
        m << std::dec << " (input " << (*inputs)[i] << " = 0x" << std::hex << std::bit_cast<std::uint32_t>((*inputs)[i]) << ")";
      ADD_FAILURE() << m;
    }
  EXPECT_EQ(diffs, 0u) << "of " << got.size() << " bytes";
}

// Floats whose rounding to fp8 exercises every case: both signs, every exponent (subnormal floats,
// inf and NaN included), the top five mantissa bits (each format's last kept bit and round bit)
// with sticky tails that are empty, minimal, half and full; plus random bit patterns.
std::vector<float> conversion_sweep(std::mt19937_64& gen) {
  std::vector<float> v;
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t e = 0; e < 256; ++e)
      for (std::uint32_t top = 0; top < 32; ++top)
        for (std::uint32_t tail : {0u, 1u, 0x1FFFFu, 0x20000u, 0x20001u, 0x3FFFFu})
          v.push_back(std::bit_cast<float>(sign << 31 | e << 23 | top << 18 | tail));
  for (int i = 0; i < 1 << 20; ++i) v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(gen())));
  return v;
}

TEST_F(CudaFp8Test, ConversionMatchesCoreBitwise) {
  const std::vector<float> v = conversion_sweep(gen);
  const Tensor x = to_device(host_f32(v));
  const auto n = static_cast<std::int64_t>(v.size());
  for (DType t : kFp8) {
    SCOPED_TRACE(dtype_name(t));
    Tensor one = to_device(host_f32({1.f}));
    Tensor q = dev_codes({n}, t);
    ops::cast_fp8(g(), x, one, q, nullptr);
    std::vector<std::uint8_t> want(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) want[i] = float_to_fp8(v[i], fp8_format(t), Fp8Overflow::satfinite);
    expect_same_bytes(bytes(q), want, &v);
  }
}

TEST_F(CudaFp8Test, CastAndAmaxMatchCpu) {
  const float specials[] = {0.f, -0.f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 464.f, -61440.f, 1e-7f, 448.f, 3e38f};
  for (DType in : kInputs)
    for (DType t : kFp8)
      for (std::int64_t n : {std::int64_t{1} << 16, std::int64_t{1000003}, std::int64_t{13}, std::int64_t{8}})
        for (std::int64_t offset : {0, 1})   // 1: views not 16-byte aligned (the scalar path)
          for (bool with_specials : {false, true})
            for (float scale : {1.f, 256.f, 0.125f}) {
              SCOPED_TRACE(::testing::Message() << dtype_name(in) << " -> " << dtype_name(t) << " n=" << n << " offset="
                                                << offset << " specials=" << with_specials << " scale=" << scale);
              std::vector<double> v = randn(static_cast<std::size_t>(n + offset), in, 30.0);
              if (with_specials)
                for (std::size_t i = 0; i < std::size(specials) && i * 7 < v.size(); ++i) v[i * 7] = specials[i];
              // The values as the device holds them, in fp32 for the CPU reference.
              const Tensor xd = dev(v, {n + offset}, in).flat_range(offset, n);
              std::vector<float> held(static_cast<std::size_t>(n));
              {
                const std::vector<double> back = values(xd);
                for (std::size_t i = 0; i < held.size(); ++i) held[i] = static_cast<float>(back[i]);
              }
              const Tensor xh = host_f32(held);
              const Tensor sd = to_device(host_f32({scale})), sh = host_f32({scale});
              Tensor qd = dev_codes({n + offset}, t).flat_range(offset, n), qh = host_codes({n}, t);
              Tensor ad = to_device(host_f32({-1.f})), ah = host_f32({-1.f});
              ops::cast_fp8(g(), xd, sd, qd, &ad);
              ops::cast_fp8(c(), xh, sh, qh, &ah);
              expect_same_bytes(bytes(qd), bytes(qh), &held);
              expect_same_bytes(bytes(ad), bytes(ah));
              Tensor ad2 = to_device(host_f32({-1.f}));
              ops::amax(g(), xd, ad2);
              expect_same_bytes(bytes(ad2), bytes(ah));
            }
}

TEST_F(CudaFp8Test, TransposeMatchesCpu) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1}, {33, 65}, {1000, 17}, {64, 128}, {7, 4099}};
  for (auto [R, C] : shapes) {
    SCOPED_TRACE(::testing::Message() << R << " x " << C);
    Tensor xh = host_codes({R, C}, DType::e4m3);
    for (std::int64_t i = 0; i < xh.numel(); ++i) xh.data_as<std::uint8_t>()[i] = static_cast<std::uint8_t>(gen());
    Tensor th = host_codes({C, R}, DType::e4m3), td = dev_codes({C, R}, DType::e4m3);
    ops::transpose_fp8(c(), xh, th);
    ops::transpose_fp8(g(), to_device(xh), td);
    expect_same_bytes(bytes(td), bytes(th));
  }
}

TEST_F(CudaFp8Test, ScaleUpdateAndRecipesMatchCpu) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> histories = {
      {1.f}, {448.f}, {449.f}, {0.f}, {nan}, {inf}, {1e-45f}, {3e38f}, {0.f, nan, 3.5f, 1e-3f}, {}};
  std::vector<float> long_history(1024);
  for (auto& h : long_history) h = std::ldexp(1.f, static_cast<int>(gen() % 40) - 20);
  for (DType t : kFp8)
    for (int margin : {0, 2})
      for (std::size_t k = 0; k < histories.size(); ++k) {
        const std::vector<float>& h = histories[k].empty() ? long_history : histories[k];
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " margin " << margin << " history " << k);
        Tensor sh = host_f32({3.f}), ih = host_f32({5.f});
        Tensor sd = to_device(sh), id = to_device(ih);
        ops::fp8_update_scale(c(), host_f32(h), fp8_format(t), margin, sh, ih);
        ops::fp8_update_scale(g(), to_device(host_f32(h)), fp8_format(t), margin, sd, id);
        expect_same_bytes(bytes(sd), bytes(sh));
        expect_same_bytes(bytes(id), bytes(ih));
      }
  // Both recipes over a sequence of tensors whose range grows and shrinks.
  for (ops::Fp8Recipe recipe : {ops::Fp8Recipe::current, ops::Fp8Recipe::delayed}) {
    ops::Fp8TensorScaling sg(g(), Fp8Format::e4m3, recipe, 4, 1), sc(c(), Fp8Format::e4m3, recipe, 4, 1);
    for (int step = 0; step < 10; ++step) {
      SCOPED_TRACE(::testing::Message() << "recipe " << static_cast<int>(recipe) << " step " << step);
      const double spread = std::ldexp(1.0, (step * 3) % 11 - 4);
      const std::vector<double> v = randn(4099, DType::f32, spread);
      std::vector<float> vf(v.begin(), v.end());
      Tensor qd = dev_codes({4099}, DType::e4m3), qh = host_codes({4099}, DType::e4m3);
      sg.quantize(g(), to_device(host_f32(vf)), qd);
      sc.quantize(c(), host_f32(vf), qh);
      expect_same_bytes(bytes(qd), bytes(qh), &vf);
      expect_same_bytes(bytes(sg.scale()), bytes(sc.scale()));
      expect_same_bytes(bytes(sg.amax_history()), bytes(sc.amax_history()));
    }
  }
}

}  // namespace
}  // namespace lmscale::test
