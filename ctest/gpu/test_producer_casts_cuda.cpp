// The FP8 casts fused into SwiGLU and its backward on CUDA (ops::swiglu_cast_transpose_fp8,
// ops::swiglu_backward_cast_transpose_fp8; docs/precision.md, "Casts fused into the producers")
// against the plain producer (ops::swiglu_rows / swiglu_rows_backward into a bf16, fp16 or fp32
// tensor) followed by ops::cast_transpose_fp8, both under delayed scaling's history update: the
// same codes, transpose, scale, inverse and history, bit for bit. Shapes take the fused kernel
// (rows and cols multiples of 8: whole and partial 64 x 64 tiles, xl's d_ff 6400) and the
// composed fallback (cols 13, rows 37; the kernel's launches are counted to tell them apart), with
// and without the direct operand, recording (the device record slot advanced) and not (slot and
// history untouched), e4m3 and e5m2, an empty history (scale kept) and a filled one (scale
// derived), and a NaN and an inf in b (both directions). Skipped (exit 77) without a GPU.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../../src/ops/cuda/resources.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

// One side's delayed-scaling state and outputs.
struct Side {
  Tensor scale, inv, history, work, slot, q, qt;
};

class ProducerCastsCuda : public CudaOpsTest {
 protected:
  // Scale 1, a history of 4 (empty, or holding amaxes that give a scale of their own).
  Side side(std::int64_t rows, std::int64_t C, Fp8Format f, bool direct, bool filled) {
    Side s;
    s.scale = dev({1.0}, {1}, DType::f32);
    s.inv = dev({1.0}, {1}, DType::f32);
    s.history = dev(filled ? std::vector<double>{3.0, 40.0, 0.5, 7.0} : std::vector<double>(4, 0.0), {4}, DType::f32);
    s.work = Tensor::empty({2}, DType::i32, gpu_.allocator(), "test_work");
    EXPECT_EQ(cudaMemset(s.work.data(), 0, 8), cudaSuccess);
    s.slot = Tensor::empty({1}, DType::i32, gpu_.allocator(), "test_slot");
    const std::int32_t three = 3;   // the device record slot: the last of the 4, so recording wraps it to 0
    EXPECT_EQ(cudaMemcpy(s.slot.data(), &three, 4, cudaMemcpyHostToDevice), cudaSuccess);
    const DType q = fp8_dtype(f);
    if (direct) s.q = Tensor::empty({rows, C}, q, gpu_.allocator(), "test_q");
    s.qt = Tensor::empty({C, rows}, q, gpu_.allocator(), "test_qt");
    for (Tensor* t : {&s.q, &s.qt}) {
      if (t->defined()) {   // bytes it must overwrite
        EXPECT_EQ(cudaMemset(t->data(), 0xAB, t->nbytes()), cudaSuccess);
      }
    }
    return s;
  }
  ops::Fp8HistoryUpdate update(Side& s, Fp8Format f, bool record) {
    return {s.history, record ? 1 : -1, f, 0, s.inv, s.work, s.slot};
  }
  // The fused kernel's launches so far (Resources::fp8_producer_cast_launches).
  std::int64_t launches() { return ops::cuda::resources(g()).fp8_producer_cast_launches; }
  // Whether a call on `sh` must take the kernel (rows and cols multiples of 8) or the fallback.
  void expect_kernel(std::int64_t before, bool fused_shape, const std::string& what) {
    EXPECT_EQ(launches() - before, fused_shape ? 1 : 0) << what << ": the fused kernel "
                                                        << (fused_shape ? "did not run" : "ran on a fallback shape");
  }
  // The device slot: advanced (3 -> 0) by a recording cast, untouched otherwise.
  void expect_slot(Side& s, bool record, const std::string& what) {
    std::int32_t v = -1;
    EXPECT_EQ(cudaMemcpy(&v, s.slot.data(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(v, record ? 0 : 3) << what << ": the record slot";
  }
  std::vector<std::uint8_t> raw(const Tensor& t) {
    std::vector<std::uint8_t> v(t.defined() ? t.nbytes() : 0);
    if (!v.empty()) {
      EXPECT_EQ(cudaMemcpy(v.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  }
  void expect_same(Side& fused, Side& plain, const std::string& what) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    EXPECT_EQ(raw(fused.q), raw(plain.q)) << what << ": codes (seed " << seed() << ")";
    EXPECT_EQ(raw(fused.qt), raw(plain.qt)) << what << ": transposed codes (seed " << seed() << ")";
    for (auto [name, a, b] : {std::tuple{"scale", &fused.scale, &plain.scale}, {"inverse", &fused.inv, &plain.inv},
                              {"history", &fused.history, &plain.history}, {"work", &fused.work, &plain.work},
                              {"slot", &fused.slot, &plain.slot}})
      EXPECT_EQ(raw(*a), raw(*b)) << what << ": " << name;
  }
};

struct Shape2 {
  std::int64_t rows, cols;
};
// Fused: 64 x 64 (one tile), 136 x 200 (partial tiles), 2048 x 6400 (xl's w2 input at 4 x 512
// tokens); composed: 37 x 64 (rows), 64 x 13 (cols).
const std::vector<Shape2> kShapes = {{64, 64}, {136, 200}, {2048, 6400}, {37, 64}, {64, 13}};

// One case of the producer tests: activations of dtype t, rows x F outputs (inputs a|b side by
// side, row stride ld = 2F), the FP8 format, and whether the history is filled.
struct Case {
  DType t;
  std::int64_t rows, F, ld;
  Fp8Format f;
  bool filled;
  std::string at;   // names the case in failure messages
};
// Every dtype x shape x format x history state.
void for_each_case(const std::function<void(const Case&)>& body) {
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (const Shape2& sh : kShapes)
      for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
        for (bool filled : {false, true})
          body({t, sh.rows, sh.cols, 2 * sh.cols, f, filled,
                std::string(dtype_name(t)) + " " + std::to_string(sh.rows) + " x " + std::to_string(sh.cols) +
                    (f == Fp8Format::e4m3 ? " e4m3" : " e5m2") + (filled ? " filled" : " empty")});
}

// The two [rows, F] column blocks (row stride 2F) of a [rows, 2F] tensor: a|b, or da|db.
std::pair<Tensor, Tensor> halves(const Tensor& ab, std::int64_t rows, std::int64_t F) {
  const std::int64_t span = (rows - 1) * 2 * F + F;
  return {ab.flat_range(0, span), ab.flat_range(F, span)};
}

TEST_F(ProducerCastsCuda, SwigluCastIsTheSwigluThenTheCast) {
  for_each_case([&](const Case& c) {
    const DType t = c.t;
    const std::int64_t rows = c.rows, F = c.F, ld = c.ld;
    const Fp8Format f = c.f;
    const bool filled = c.filled, direct = filled, record = !filled || t != DType::f16;
    const std::string& at = c.at;
    const Tensor ab = dev(randn(static_cast<std::size_t>(rows * 2 * F), t, 2.0), {rows, 2 * F}, t);
    const auto [a, b] = halves(ab, rows, F);
    Side fused = side(rows, F, f, direct, filled), plain = side(rows, F, f, direct, filled);
    ops::Fp8HistoryUpdate uf = update(fused, f, record), up = update(plain, f, record);
    const std::int64_t before = launches();
    ops::swiglu_cast_transpose_fp8(g(), a, b, rows, F, ld, fused.scale, direct ? &fused.q : nullptr, fused.qt, &uf);
    expect_kernel(before, rows % 8 == 0 && F % 8 == 0, "swiglu " + at);
    Tensor h = poisoned({rows, F}, t);
    ops::swiglu_rows(g(), a, b, rows, F, ld, h);
    ops::cast_transpose_fp8(g(), h, plain.scale, direct ? &plain.q : nullptr, &plain.qt, &up);
    expect_same(fused, plain, "swiglu " + at);
    expect_slot(fused, record, "swiglu " + at);
  });
}

TEST_F(ProducerCastsCuda, SwigluBackwardCastIsTheBackwardThenTheCast) {
  for_each_case([&](const Case& c) {
    const DType t = c.t;
    const std::int64_t rows = c.rows, F = c.F, ld = c.ld;
    const Fp8Format f = c.f;
    const bool filled = c.filled, direct = !filled, record = filled || t != DType::bf16;
    const std::string& at = c.at;
    const Tensor ab = dev(randn(static_cast<std::size_t>(rows * 2 * F), t, 2.0), {rows, 2 * F}, t);
    const auto [a, b] = halves(ab, rows, F);
    const Tensor dh = dev(randn(static_cast<std::size_t>(rows * F), t, 1.0), {rows, F}, t);
    Side fused = side(rows, 2 * F, f, direct, filled), plain = side(rows, 2 * F, f, direct, filled);
    ops::Fp8HistoryUpdate uf = update(fused, f, record), up = update(plain, f, record);
    const std::int64_t before = launches();
    ops::swiglu_backward_cast_transpose_fp8(g(), a, b, rows, F, ld, dh, fused.scale, direct ? &fused.q : nullptr,
                                            fused.qt, &uf);
    expect_kernel(before, rows % 8 == 0 && F % 8 == 0, "swiglu backward " + at);
    Tensor dab = poisoned({rows, 2 * F}, t);
    auto [da, db] = halves(dab, rows, F);
    ops::swiglu_rows_backward(g(), a, b, rows, F, ld, dh, da, db);
    ops::cast_transpose_fp8(g(), dab, plain.scale, direct ? &plain.q : nullptr, &plain.qt, &up);
    expect_same(fused, plain, "swiglu backward " + at);
    expect_slot(fused, record, "swiglu backward " + at);
  });
}

TEST_F(ProducerCastsCuda, NonFiniteValuesReachTheHistoryAlike) {
  constexpr double kInf = std::numeric_limits<double>::infinity(), kNaN = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {kInf, kNaN}) {
    const std::int64_t rows = 64, F = 64, ld = 2 * F;
    std::vector<double> v = randn(static_cast<std::size_t>(rows * 2 * F), DType::bf16, 1.0);
    v[static_cast<std::size_t>(5 * ld + 3)] = 1.0;       // a[5][3] > 0
    v[static_cast<std::size_t>(5 * ld + F + 3)] = bad;   // b[5][3]: h[5][3], da[5][3] = bad
    const Tensor ab = dev(v, {rows, 2 * F}, DType::bf16);
    const auto [a, b] = halves(ab, rows, F);
    Side fused = side(rows, F, Fp8Format::e4m3, true, true), plain = side(rows, F, Fp8Format::e4m3, true, true);
    ops::Fp8HistoryUpdate uf = update(fused, Fp8Format::e4m3, true), up = update(plain, Fp8Format::e4m3, true);
    ops::swiglu_cast_transpose_fp8(g(), a, b, rows, F, ld, fused.scale, &fused.q, fused.qt, &uf);
    Tensor h = poisoned({rows, F}, DType::bf16);
    ops::swiglu_rows(g(), a, b, rows, F, ld, h);
    ops::cast_transpose_fp8(g(), h, plain.scale, &plain.q, &plain.qt, &up);
    const std::string what = std::string("swiglu with a ") + (bad == kInf ? "inf" : "NaN");
    expect_same(fused, plain, what);
    const std::vector<double> hist = values(fused.history);   // recorded at the device slot, 3
    EXPECT_FALSE(std::isfinite(hist[3])) << what << ": the recorded amax is " << hist[3];
    // The backward: da[5][3] = dh b s (...) is non-finite too.
    const Tensor dh = dev(randn(static_cast<std::size_t>(rows * F), DType::bf16, 1.0), {rows, F}, DType::bf16);
    Side fused_b = side(rows, 2 * F, Fp8Format::e5m2, true, true), plain_b = side(rows, 2 * F, Fp8Format::e5m2, true, true);
    ops::Fp8HistoryUpdate ufb = update(fused_b, Fp8Format::e5m2, true), upb = update(plain_b, Fp8Format::e5m2, true);
    ops::swiglu_backward_cast_transpose_fp8(g(), a, b, rows, F, ld, dh, fused_b.scale, &fused_b.q, fused_b.qt, &ufb);
    Tensor dab = poisoned({rows, 2 * F}, DType::bf16);
    auto [da, db] = halves(dab, rows, F);
    ops::swiglu_rows_backward(g(), a, b, rows, F, ld, dh, da, db);
    ops::cast_transpose_fp8(g(), dab, plain_b.scale, &plain_b.q, &plain_b.qt, &upb);
    expect_same(fused_b, plain_b, "backward, " + what);
    const std::vector<double> hist_b = values(fused_b.history);
    EXPECT_FALSE(std::isfinite(hist_b[3])) << "backward, " << what << ": the recorded amax is " << hist_b[3];
  }
}

}  // namespace
}  // namespace lmscale::test
