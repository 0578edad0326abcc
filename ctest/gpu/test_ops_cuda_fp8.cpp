// The FP8 ops on CUDA against their CPU references (lmscale/ops/fp8.h): the cast (the hardware's
// cvt.rn.satfinite against core/fp8.h's conversion, bit for bit, over a sweep of every float
// exponent with the rounding-relevant mantissa bits and over specials), amax, the transpose, the
// scale rule and the recipes bitwise; the cuBLASLt FP8 GEMM against the fp64 product of the same
// fp8 operands, and a linear layer's three FP8 products against the exact products of the bf16
// data within the bound derived in docs/precision.md.
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
#include "lmscale/ops/fp8_linear.h"
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
      EXPECT_EQ(sg.next_slot(g()), sc.next_slot(c()));   // the device's record slot (CUDA) and the host's (CPU)
    }
  }
}

// The fused scale updates (ops::fp8_amax_update_scale; cast_fp8 with an Fp8HistoryUpdate, delayed
// scaling's one-launch cast) bitwise against the CPU: the codes, the history with the recorded
// amax, the scale and its inverse, over sizes that leave partial blocks and chunks (and empty x),
// unaligned views, specials (NaN, inf, values that saturate) and histories with NaN, inf and
// nothing usable (the scale is kept). The work words must be zero after each launch (the last
// block resets them; the next launch relies on it).
TEST_F(CudaFp8Test, FusedScaleUpdatesMatchCpu) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> histories = {
      {0.f}, {0.f, 0.f, 0.f, 0.f, 0.f}, {1.f, nan, 3.5f, 600.f, 1e-3f}, {nan}, {inf, 2.f, 0.5f}};
  const float specials[] = {0.f, -0.f, inf, -inf, nan, 464.f, -61440.f, 1e-7f, 448.f, 3e38f};
  Tensor work_d = Tensor::empty({2}, DType::i32, gpu_.allocator(), "test_dev");
  ops::fill(g(), work_d, 0.0);
  Tensor work_h = Tensor::empty({2}, DType::i32, cpu_.host(), "test_host");
  ops::fill(c(), work_h, 0.0);
  const std::vector<std::uint8_t> zero_work(8, 0);
  int variant = 0;
  for (DType in : kInputs)
    for (DType t : kFp8)
      for (std::int64_t n : {(std::int64_t{1} << 16) + 5, std::int64_t{1000003}, std::int64_t{13}, std::int64_t{8},
                             std::int64_t{0}})
        for (std::int64_t offset : {0, 1})
          for (bool with_specials : {false, true}) {
            const std::vector<float>& hist = histories[static_cast<std::size_t>(variant % 5)];
            const int margin = (variant / 5) % 2 ? 3 : 0;
            ++variant;
            const auto H = static_cast<std::int64_t>(hist.size());
            const std::int64_t slot = n % H;
            SCOPED_TRACE(::testing::Message() << dtype_name(in) << " -> " << dtype_name(t) << " n=" << n << " offset="
                                              << offset << " specials=" << with_specials << " history "
                                              << (variant - 1) % 5 << " margin " << margin);
            std::vector<double> v = randn(static_cast<std::size_t>(n + offset), in, 30.0);
            if (with_specials)
              for (std::size_t i = 0; i < std::size(specials) && i * 7 < v.size(); ++i) v[i * 7] = specials[i];
            const Tensor xd = dev(v, {n + offset}, in).flat_range(offset, n);
            std::vector<float> held(static_cast<std::size_t>(n));
            {
              const std::vector<double> back = values(xd);
              for (std::size_t i = 0; i < held.size(); ++i) held[i] = static_cast<float>(back[i]);
            }
            const Tensor xh = host_f32(held);
            const Fp8Format f = fp8_format(t);
            {   // current scaling's amax pass
              Tensor hh = host_f32(hist), sh = host_f32({3.f}), ih = host_f32({5.f});
              Tensor hd = to_device(hh), sd = to_device(sh), id = to_device(ih);
              ops::fp8_amax_update_scale(g(), xd, hd, slot, f, margin, sd, id, work_d);
              ops::fp8_amax_update_scale(c(), xh, hh, slot, f, margin, sh, ih, work_h);
              expect_same_bytes(bytes(hd), bytes(hh));
              expect_same_bytes(bytes(sd), bytes(sh));
              expect_same_bytes(bytes(id), bytes(ih));
              expect_same_bytes(bytes(work_d), zero_work);
            }
            for (std::int64_t record : {slot, std::int64_t{-1}}) {   // delayed scaling's cast
              SCOPED_TRACE(::testing::Message() << "record " << record);
              Tensor hh = host_f32(hist), sh = host_f32({3.f}), ih = host_f32({5.f});
              Tensor hd = to_device(hh), sd = to_device(sh), id = to_device(ih);
              Tensor qd = dev_codes({n + offset}, t).flat_range(offset, n), qh = host_codes({n}, t);
              const ops::Fp8HistoryUpdate ud{hd, record, f, margin, id, work_d}, uh{hh, record, f, margin, ih, work_h};
              ops::cast_fp8(g(), xd, sd, qd, nullptr, &ud);
              ops::cast_fp8(c(), xh, sh, qh, nullptr, &uh);
              expect_same_bytes(bytes(qd), bytes(qh), &held);
              expect_same_bytes(bytes(hd), bytes(hh));
              expect_same_bytes(bytes(sd), bytes(sh));
              expect_same_bytes(bytes(id), bytes(ih));
              expect_same_bytes(bytes(work_d), zero_work);
            }
          }
}

// The fused cast + transpose (ops::cast_transpose_fp8) bitwise against the CPU (itself bitwise
// cast_fp8 + transpose_fp8, test_ops_fp8): shapes that are and are not multiples of the tiles
// (64 x 64 in the general kernel, 128 x 64 rows x columns in the 8-wide one) and of the 4- and
// 8-byte groups (so the 8-wide, word and byte paths run), views whose rows are
// not aligned (x one element in, out and out_t one byte in: the byte paths), specials, both
// outputs or the transpose alone, a given scale and delayed scaling's update (derived scale,
// recorded amax; the work words zero after).
TEST_F(CudaFp8Test, CastTransposeMatchesCpu) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.f, -0.f, inf, -inf, nan, 464.f, -61440.f, 1e-7f, 448.f, 3e38f};
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {64, 64}, {33, 65}, {1000, 17}, {128, 256}, {7, 4099}, {130, 66}, {2048, 512}, {3, 2},
      {96, 200}, {520, 72}};   // the last two: the 8-wide kernel (multiples of 8) with partial tiles
  Tensor work_d = Tensor::empty({2}, DType::i32, gpu_.allocator(), "test_dev");
  ops::fill(g(), work_d, 0.0);
  Tensor work_h = Tensor::empty({2}, DType::i32, cpu_.host(), "test_host");
  ops::fill(c(), work_h, 0.0);
  const std::vector<std::uint8_t> zero_work(8, 0);
  int variant = 0;
  for (DType in : kInputs)
    for (DType t : kFp8)
      for (auto [M, K] : shapes)
        for (std::int64_t offset : {0, 1}) {
          const bool with_out = variant % 3 != 2, with_specials = variant % 2 == 1;
          const int mode = variant % 4;   // 0, 1: a given scale; 2: update without record; 3: with record
          ++variant;
          SCOPED_TRACE(::testing::Message() << dtype_name(in) << " -> " << dtype_name(t) << " " << M << " x " << K
                                            << " offset " << offset << " out " << with_out << " specials "
                                            << with_specials << " mode " << mode);
          const std::int64_t n = M * K;
          std::vector<double> v = randn(static_cast<std::size_t>(n + offset), in, 30.0);
          if (with_specials)
            for (std::size_t i = 0; i < std::size(specials); ++i) v[(i * 131) % v.size()] = specials[i];
          const Tensor xd = dev(v, {n + offset}, in).flat_range(offset, n).reshape({M, K});
          std::vector<float> held(static_cast<std::size_t>(n));
          {
            const std::vector<double> back = values(xd);
            for (std::size_t i = 0; i < held.size(); ++i) held[i] = static_cast<float>(back[i]);
          }
          const Tensor xh = host_f32(held).reshape({M, K});
          const std::vector<float> hist = {3.f, nan, 0.02f};
          Tensor hh = host_f32(hist), sh = host_f32({mode < 2 ? 64.f : 1.f}), ih = host_f32({1.f});
          Tensor hd = to_device(hh), sd = to_device(sh), id = to_device(ih);
          Tensor qd = dev_codes({n + offset}, t).flat_range(offset, n).reshape({M, K}), qh = host_codes({M, K}, t);
          Tensor td = dev_codes({n + offset}, t).flat_range(offset, n).reshape({K, M}), th = host_codes({K, M}, t);
          const std::int64_t record = mode == 3 ? 1 : -1;
          const ops::Fp8HistoryUpdate ud{hd, record, fp8_format(t), 1, id, work_d},
              uh{hh, record, fp8_format(t), 1, ih, work_h};
          ops::cast_transpose_fp8(g(), xd, sd, with_out ? &qd : nullptr, &td, mode >= 2 ? &ud : nullptr);
          ops::cast_transpose_fp8(c(), xh, sh, with_out ? &qh : nullptr, &th, mode >= 2 ? &uh : nullptr);
          expect_same_bytes(bytes(td), bytes(th));
          if (with_out) expect_same_bytes(bytes(qd), bytes(qh), &held);
          expect_same_bytes(bytes(hd), bytes(hh));
          expect_same_bytes(bytes(sd), bytes(sh));
          expect_same_bytes(bytes(id), bytes(ih));
          expect_same_bytes(bytes(work_d), zero_work);
        }
  // Both recipes' quantize into both outputs over a sequence of tensors, as Fp8Linear runs them.
  for (ops::Fp8Recipe recipe : {ops::Fp8Recipe::current, ops::Fp8Recipe::delayed}) {
    ops::Fp8TensorScaling sg(g(), Fp8Format::e5m2, recipe, 3, 0), sc(c(), Fp8Format::e5m2, recipe, 3, 0);
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE(::testing::Message() << "recipe " << static_cast<int>(recipe) << " step " << step);
      const std::int64_t M = 96, K = 80;
      const std::vector<double> v = randn(static_cast<std::size_t>(M * K), DType::f32, std::ldexp(1.0, 3 * step - 6));
      std::vector<float> vf(v.begin(), v.end());
      Tensor qd = dev_codes({M, K}, DType::e5m2), qh = host_codes({M, K}, DType::e5m2);
      Tensor td = dev_codes({K, M}, DType::e5m2), th = host_codes({K, M}, DType::e5m2);
      sg.quantize(g(), to_device(host_f32(vf)).reshape({M, K}), &qd, &td);
      sc.quantize(c(), host_f32(vf).reshape({M, K}), &qh, &th);
      expect_same_bytes(bytes(qd), bytes(qh), &vf);
      expect_same_bytes(bytes(td), bytes(th));
      expect_same_bytes(bytes(sg.scale()), bytes(sc.scale()));
      expect_same_bytes(bytes(sg.inv_scale()), bytes(sc.inv_scale()));
      expect_same_bytes(bytes(sg.amax_history()), bytes(sc.amax_history()));
      EXPECT_EQ(sg.next_slot(g()), sc.next_slot(c()));
    }
  }
}

// ops::gather_scalars (a linear layer's saved scales in one launch) against the CPU, specials
// included; the padding between the values keeps its bytes.
TEST_F(CudaFp8Test, GatherScalarsMatchesCpu) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> vals = {1.5f, -inf, nan, 0.25f, 3e38f, -0.f, 1e-40f, 448.f};
  for (std::int64_t stride : {1, 4, 7})
    for (std::size_t count : {std::size_t{1}, std::size_t{4}, std::size_t{8}}) {
      SCOPED_TRACE(::testing::Message() << "stride " << stride << " sources " << count);
      std::vector<Tensor> hs, ds;
      for (std::size_t i = 0; i < count; ++i) {
        hs.push_back(host_f32({vals[i]}));
        ds.push_back(to_device(hs.back()));
      }
      const auto need = static_cast<std::size_t>((static_cast<std::int64_t>(count) - 1) * stride + 3);
      Tensor oh = host_f32(std::vector<float>(need, -2.f)), od = to_device(oh);
      auto list = [&](std::vector<Tensor>& v) {
        std::vector<const Tensor*> p;
        for (const Tensor& t : v) p.push_back(&t);
        return p;
      };
      const std::vector<const Tensor*> ph = list(hs), pd = list(ds);
      // The op takes an initializer list: the sources spelled out up to the count.
      auto call = [&](Context& ctx, const std::vector<const Tensor*>& p, Tensor& out) {
        if (count == 1) ops::gather_scalars(ctx, {p[0]}, out, stride);
        else if (count == 4) ops::gather_scalars(ctx, {p[0], p[1], p[2], p[3]}, out, stride);
        else ops::gather_scalars(ctx, {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]}, out, stride);
      };
      call(g(), pd, od);
      call(c(), ph, oh);
      expect_same_bytes(bytes(od), bytes(oh));
      EXPECT_EQ(std::bit_cast<std::uint32_t>(oh.data_as<float>()[stride * (static_cast<std::int64_t>(count) - 1)]),
                std::bit_cast<std::uint32_t>(vals[count - 1]));
    }
}

// Random finite codes.
Tensor random_codes(Tensor h, std::mt19937_64& gen) {
  const Fp8Format f = fp8_format(h.dtype());
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    std::uint8_t c;
    do c = static_cast<std::uint8_t>(gen());
    while (!std::isfinite(fp8_to_float(c, f)));
    h.data_as<std::uint8_t>()[i] = c;
  }
  return h;
}

// |got - ref| <= tol_abs_sum * sum_k |a_k b_k| * factor + tol_out * |ref| element by element,
// where abs_ref holds the sums of |a_k b_k| * factor (the CPU reference of |a| |b|^T).
void expect_within(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& abs_ref,
                   double tol_abs_sum, double tol_out, std::uint64_t seed) {
  ASSERT_EQ(got.size(), ref.size());
  std::size_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = tol_abs_sum * abs_ref[i] + tol_out * std::fabs(ref[i]);
    const double err = std::fabs(got[i] - ref[i]);
    if (abs_ref[i] > 0) worst = std::max(worst, err / abs_ref[i]);
    if (!(err <= bound) && ++bad <= 8)
      ADD_FAILURE() << "element " << i << ": gpu " << got[i] << ", reference " << ref[i] << ", |error| " << err
                    << " > bound " << bound << " (seed " << seed << ")";
  }
  EXPECT_EQ(bad, 0u) << "of " << got.size() << "; worst |error| / sum|a b| = " << worst;
  std::printf("worst |error| / sum_k |a_k b_k| = %.3g (bound %.3g)\n", worst, tol_abs_sum);
}

// The accumulation bound of cuBLASLt's FP8 GEMM: fp32 accumulation (fast accumulation off), but
// Hopper's FP8 tensor cores keep fewer bits inside one MMA chain (about 14, DeepSeek-V3 report §3.3);
// the bound is 2^-9 of sum |a_k b_k|, empirical: 1.95x the worst measured on an H100, 1.0e-3 on
// same-sign data (docs/precision.md, "Error bounds").
constexpr double kGemmAccumulation = 1.0 / 512;

TEST_F(CudaFp8Test, GemmMatchesCpuReferenceOfTheSameOperands) {
  if (!has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores (compute capability < 8.9)";
  struct Shape3 {
    std::int64_t M, N, K;
  };
  const std::vector<Shape3> shapes = {{16, 16, 16}, {64, 48, 32}, {200, 96, 256}, {8, 1024, 4096}};
  const std::vector<std::pair<DType, DType>> types = {
      {DType::e4m3, DType::e4m3}, {DType::e5m2, DType::e4m3}, {DType::e4m3, DType::e5m2}};
  for (const Shape3& s : shapes)
    for (auto [ta, tb] : types)
      for (DType yt : {DType::bf16, DType::f32})
        for (bool acc : {false, true}) {
          if (acc && yt != DType::f32) continue;
          SCOPED_TRACE(::testing::Message() << s.M << "x" << s.N << "x" << s.K << " " << dtype_name(ta) << " x "
                                            << dtype_name(tb) << " -> " << dtype_name(yt) << " acc=" << acc);
          const Tensor ah = random_codes(host_codes({s.M, s.K}, ta), gen), bh = random_codes(host_codes({s.N, s.K}, tb), gen);
          const float a_inv = 1.f / 64, b_inv = 2.f;
          // Reference: y and the sums of |a_k b_k| (the operands' magnitudes), in fp64.
          Tensor yh = Tensor::empty({s.M, s.N}, DType::f64, cpu_.host(), "test_host");
          Tensor abs_h = Tensor::empty({s.M, s.N}, DType::f64, cpu_.host(), "test_host");
          const std::vector<double> y0 = randn(static_cast<std::size_t>(s.M * s.N), yt);
          if (acc) std::memcpy(yh.data(), y0.data(), yh.nbytes());
          ops::linear_fp8(c(), ah, host_f32({a_inv}), bh, host_f32({b_inv}), yh, acc);
          Tensor aa = host_codes({s.M, s.K}, ta), ba = host_codes({s.N, s.K}, tb);
          for (std::int64_t i = 0; i < aa.numel(); ++i) aa.data_as<std::uint8_t>()[i] = ah.data_as<std::uint8_t>()[i] & 0x7F;
          for (std::int64_t i = 0; i < ba.numel(); ++i) ba.data_as<std::uint8_t>()[i] = bh.data_as<std::uint8_t>()[i] & 0x7F;
          ops::linear_fp8(c(), aa, host_f32({a_inv}), ba, host_f32({b_inv}), abs_h, false);
          Tensor yd = acc ? dev(y0, {s.M, s.N}, yt) : poisoned({s.M, s.N}, yt);
          ops::linear_fp8(g(), to_device(ah), to_device(host_f32({a_inv})), to_device(bh), to_device(host_f32({b_inv})),
                          yd, acc);
          const double out_rounding = yt == DType::bf16 ? 1.0 / 256 : 1.0 / (1 << 23);
          expect_within(values(yd), values(yh), values(abs_h), kGemmAccumulation, out_rounding, seed());
        }
}

TEST_F(CudaFp8Test, GemmRefusesWhatCublasLtCannotDo) {
  // On a GPU without FP8 tensor cores every FP8 product is refused: the throws below hold too.
  const Tensor a = poisoned({16, 24}, DType::e4m3), b = poisoned({16, 24}, DType::e4m3);   // K = 24
  const Tensor one = to_device(host_f32({1.f}));
  Tensor y = poisoned({16, 16}, DType::bf16);
  EXPECT_THROW(ops::linear_fp8(g(), a, one, b, one, y, false), std::exception);
  const Tensor a32 = poisoned({16, 32}, DType::e4m3), b32 = poisoned({16, 32}, DType::e4m3);
  EXPECT_THROW(ops::linear_fp8(g(), a32, one, b32, one, y, true), std::exception);   // accumulate into bf16
  Tensor y16 = poisoned({16, 16}, DType::f16);
  EXPECT_THROW(ops::linear_fp8(g(), a32, one, b32, one, y16, false), std::exception);
}

// A linear layer's forward and backward in FP8 (current scaling: x and w in e4m3, dy in e5m2)
// against the exact products of the bf16 data, element by element, within
//   (u_p + u_q + u_p u_q + 2^-12) sum_k |p_k q_k| + subnormal terms + output rounding
// (docs/precision.md); the bf16 GEMM of the same data is printed beside it for comparison.
TEST_F(CudaFp8Test, LinearLayerAgainstBf16) {
  if (!has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores (compute capability < 8.9)";
  const std::int64_t M = 256, K = 512, N = 384;
  const auto xv = randn(static_cast<std::size_t>(M * K), DType::bf16, 1.0);
  const auto wv = randn(static_cast<std::size_t>(N * K), DType::bf16, 0.04);
  const auto dyv = randn(static_cast<std::size_t>(M * N), DType::bf16, 1e-4);
  const Tensor x = dev(xv, {M, K}, DType::bf16), w = dev(wv, {N, K}, DType::bf16), dy = dev(dyv, {M, N}, DType::bf16);
  struct Quantized {
    Tensor q, inv;
    double u, d;
  };
  auto quantize = [&](const Tensor& t, Fp8Format f) {
    ops::Fp8TensorScaling s(g(), f, ops::Fp8Recipe::current, 1, 0);
    Tensor q = dev_codes(t.shape(), fp8_dtype(f));
    s.quantize(g(), t, q);
    const double inv = values(s.inv_scale())[0];
    const bool e4 = f == Fp8Format::e4m3;
    return Quantized{q, s.inv_scale(), e4 ? 1.0 / 16 : 1.0 / 8, std::ldexp(inv, e4 ? -10 : -17)};
  };
  auto transposed = [&](const Tensor& q) {
    Tensor t = dev_codes({q.dim(1), q.dim(0)}, q.dtype());
    ops::transpose_fp8(g(), q, t);
    return t;
  };
  const Quantized xq = quantize(x, Fp8Format::e4m3), wq = quantize(w, Fp8Format::e4m3),
                  dyq = quantize(dy, Fp8Format::e5m2);
  Tensor y = poisoned({M, N}, DType::f32), dx = poisoned({M, K}, DType::f32), dw = poisoned({N, K}, DType::f32);
  ops::linear_fp8(g(), xq.q, xq.inv, wq.q, wq.inv, y, false);
  ops::linear_fp8(g(), dyq.q, dyq.inv, transposed(wq.q), wq.inv, dx, false);
  ops::linear_fp8(g(), transposed(dyq.q), dyq.inv, transposed(xq.q), xq.inv, dw, false);
  // The bf16 GEMMs write bf16 y and dx (ops::linear keeps x's dtype) and an fp32 dw.
  Tensor yb = poisoned({M, N}, DType::bf16), dxb = poisoned({M, K}, DType::bf16), dwb = poisoned({N, K}, DType::f32);
  ops::linear(g(), x, w, yb);
  ops::linear_backward(g(), x, w, dy, &dxb, &dwb, false);
  // out[R,C] = p[R,L] q[C,L]^T, element (r, c) of p at p[r*ps_r + l*ps_l] (transposes without copies).
  auto check = [&](const char* what, const Tensor& got, const Tensor& bf16, const std::vector<double>& p,
                   std::int64_t ps_r, std::int64_t ps_l, const Quantized& pq, const std::vector<double>& q,
                   std::int64_t qs_c, std::int64_t qs_l, const Quantized& qq, std::int64_t R, std::int64_t C,
                   std::int64_t L) {
    SCOPED_TRACE(what);
    const auto gv = values(got), bv = values(bf16);
    std::size_t bad = 0;
    double num = 0, den = 0, num_bf16 = 0;
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t cc = 0; cc < C; ++cc) {
        double exact = 0, abs_sum = 0, sub = 0;
        for (std::int64_t l = 0; l < L; ++l) {
          const double pv = p[static_cast<std::size_t>(r * ps_r + l * ps_l)],
                       qv = q[static_cast<std::size_t>(cc * qs_c + l * qs_l)];
          exact += pv * qv;
          abs_sum += std::fabs(pv * qv);
          sub += (1 + pq.u) * std::fabs(pv) * qq.d + (1 + qq.u) * std::fabs(qv) * pq.d + pq.d * qq.d;
        }
        const double bound = (pq.u + qq.u + pq.u * qq.u + kGemmAccumulation) * abs_sum + sub * (1 + kGemmAccumulation);
        const std::size_t i = static_cast<std::size_t>(r * C + cc);
        const double err = std::fabs(gv[i] - exact);
        num += err * err, den += exact * exact, num_bf16 += (bv[i] - exact) * (bv[i] - exact);
        if (!(err <= bound) && ++bad <= 5)
          ADD_FAILURE() << "(" << r << "," << cc << "): fp8 " << gv[i] << ", exact " << exact << ", |error| " << err
                        << " > bound " << bound << " (seed " << seed() << ")";
      }
    EXPECT_EQ(bad, 0u);
    std::printf("%s: normwise relative error fp8 %.3g, bf16 GEMM %.3g\n", what, std::sqrt(num / den),
                std::sqrt(num_bf16 / den));
    EXPECT_LT(std::sqrt(num / den), 0.1);
  };
  check("forward y = x w^T", y, yb, xv, K, 1, xq, wv, K, 1, wq, M, N, K);
  check("data gradient dx = dy w", dx, dxb, dyv, N, 1, dyq, wv, 1, K, wq, M, K, N);
  check("weight gradient dw = dy^T x", dw, dwb, dyv, 1, N, dyq, xv, 1, K, xq, N, K, M);
}

// ops::Fp8Linear on CUDA (bf16 x, w, dy; bf16 y and dx, fp32 dw) against the CPU's Fp8Linear on
// the same values: the operands quantise to the same codes (the cast is bitwise the CPU's), so
// the outputs differ by the GEMM's accumulation and the bf16 output rounding only. Under each
// precision.fp8_fast_accum setting (the CPU ignores it): at K <= 512 fast accumulation's error
// stays far below the normwise 2e-2 (its elementwise bound: test_fp8_fast_accum_cuda.cpp).
TEST_F(CudaFp8Test, Fp8LinearMatchesCpu) {
  if (!has_fp8_gemm()) GTEST_SKIP() << "no FP8 tensor cores (compute capability < 8.9)";
  const std::int64_t M = 128, K = 512, N = 256;
  const auto xv = randn(static_cast<std::size_t>(M * K), DType::bf16, 2.0);
  const auto wv = randn(static_cast<std::size_t>(N * K), DType::bf16, 0.04);
  const auto dyv = randn(static_cast<std::size_t>(M * N), DType::bf16, 1e-3);
  using Acc = ops::Fp8Accumulation;
  std::vector<ops::Fp8LinearOptions> cases;   // each recipe under fp8_fast_accum = none, forward, all
  for (ops::Fp8Recipe recipe : {ops::Fp8Recipe::current, ops::Fp8Recipe::delayed})
    for (const auto& [fwd, grad] : {std::pair{Acc::promoted, Acc::promoted}, std::pair{Acc::fast, Acc::promoted},
                                    std::pair{Acc::fast, Acc::fast}}) {
      ops::Fp8LinearOptions o;
      o.recipe = recipe;
      o.forward_accumulation = fwd;
      o.grad_accumulation = grad;
      cases.push_back(o);
    }
  for (const ops::Fp8LinearOptions& o : cases) {
    SCOPED_TRACE(::testing::Message() << "recipe " << static_cast<int>(o.recipe) << ", fast forward "
                                      << (o.forward_accumulation == Acc::fast) << ", fast gradients "
                                      << (o.grad_accumulation == Acc::fast));
    ops::Fp8Linear lg(g(), o), lc(c(), o);
    Tensor yg = poisoned({M, N}, DType::bf16), dxg = poisoned({M, K}, DType::bf16), dwg = poisoned({N, K}, DType::f32);
    Tensor yc = ref(std::vector<double>(static_cast<std::size_t>(M * N)), {M, N});
    Tensor dxc = ref(std::vector<double>(static_cast<std::size_t>(M * K)), {M, K});
    Tensor dwc = ref(std::vector<double>(static_cast<std::size_t>(N * K)), {N, K});
    const Tensor xg = dev(xv, {M, K}, DType::bf16), wg = dev(wv, {N, K}, DType::bf16), dyg = dev(dyv, {M, N}, DType::bf16);
    const Tensor xc = host(xv, {M, K}, DType::f32), wc = host(wv, {N, K}, DType::f32), dyc = host(dyv, {M, N}, DType::f32);
    for (int step = 0; step < 2; ++step) {   // the second step of delayed scaling uses the history
      const ops::Fp8LinearSaved sg = lg.forward(g(), xg, wg, yg);
      lg.backward(g(), sg, dyg, &dxg, &dwg, false);
      const ops::Fp8LinearSaved sc = lc.forward(c(), xc, wc, yc);
      lc.backward(c(), sc, dyc, &dxc, &dwc, false);
      expect_same_bytes(bytes(sg.xt_q), bytes(sc.xt_q));
      expect_same_bytes(bytes(sg.wt_q), bytes(sc.wt_q));
      EXPECT_CLOSE(values(yg), values(yc), 2e-2);
      EXPECT_CLOSE(values(dxg), values(dxc), 2e-2);
      EXPECT_CLOSE(values(dwg), values(dwc), 1e-2);
    }
  }
}

}  // namespace
}  // namespace lmscale::test
