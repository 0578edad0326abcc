// Issue 14 on the GPU: the fused LM head + cross-entropy (ops::linear_cross_entropy) against the
// float64 CPU reference in fp32 and bf16 (chunked with a remainder, and one chunk), and RoPE at
// long positions against a direct long-double computation at position 32767 = 2^15 - 1 over every
// frequency pair of a 128-wide head (the 8B model's).
#include <cmath>

#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

TEST_F(CudaOpsTest, LinearCrossEntropyMatchesCpuReference) {
  struct Case {
    std::int64_t N, d, V, chunk;
  };
  for (DType t : {DType::f32, DType::bf16})
    for (const auto& [N, d, V, chunk] : {Case{300, 64, 1000, 128}, Case{300, 64, 1000, 300}, Case{37, 48, 5003, 5}})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " N=" << N << " d=" << d << " V=" << V
                                          << " chunk=" << chunk << (accumulate ? " accumulate" : ""));
        const auto y = randn(N * d, t), w = randn(V * d, t, 0.2), dw0 = randn(V * d, DType::f32, 1e-3);
        const auto targets = randint(N, 0, static_cast<std::int32_t>(V));
        const double scale = 1.0 / static_cast<double>(N);
        Tensor loss = poisoned({1}, DType::f32), dy = poisoned({N, d}, t);
        Tensor dw = accumulate ? dev(dw0, {V, d}, DType::f32) : poisoned({V, d}, DType::f32);
        ops::linear_cross_entropy(g(), dev(y, {N, d}, t), dev(w, {V, d}, t), dev_ids(targets, {N}), loss, &dy, &dw,
                                  accumulate, scale, chunk);
        Tensor lossr = ref({0.0}, {1}), dyr = ref(std::vector<double>(N * d), {N, d});
        Tensor dwr = accumulate ? ref(dw0, {V, d}) : ref(std::vector<double>(V * d), {V, d});
        ops::linear_cross_entropy(c(), ref(y, {N, d}), ref(w, {V, d}), host_ids(targets, {N}), lossr, &dyr, &dwr,
                                  accumulate, scale, chunk);
        // bf16: the logits and their gradient are rounded to bf16 (as in the unfused path).
        EXPECT_CLOSE(values(loss), values(lossr), t == DType::f32 ? 1e-5 : 2e-3);
        EXPECT_CLOSE(values(dy), values(dyr), tolerance(t));
        EXPECT_CLOSE(values(dw), values(dwr), tolerance(t));
        // Loss only (evaluation): the same loss.
        Tensor loss2 = poisoned({1}, DType::f32);
        ops::linear_cross_entropy(g(), dev(y, {N, d}, t), dev(w, {V, d}, t), dev_ids(targets, {N}), loss2, nullptr,
                                  nullptr, false, 1.0, chunk);
        EXPECT_CLOSE(values(loss2), values(lossr), t == DType::f32 ? 1e-5 : 2e-3);
      }
}

// RoPE angles pos * theta^(-2i/Dh) reach 32767 rad; computed in fp32 they would be off by up to
// ~2e-3 rad (32767 * 2^-24), so the rotated pair would be off by ~2e-3 relative. The CUDA kernel
// reads cos/sin from a table computed in double (Resources::rope_table): fp32 results must agree
// with the long-double rotation to 2e-6 of the pair's norm (the fp32 rounding of cos, sin and the
// products); bf16 to 8e-3 (the bf16 rounding of the output, 2^-8).
TEST_F(CudaOpsTest, RopeAtPosition32767MatchesLongDoubleOnEveryPair) {
  const std::int64_t B = 1, T = 32768, H = 2, Dh = 128, half = Dh / 2;
  const double theta = 10000.0;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto x = randn(B * T * H * Dh, t);
    Tensor xd = dev(x, {B, T, H, Dh}, t);
    ops::rope(g(), xd, B, T, H, Dh, theta, false);
    const auto got = values(xd);
    const double tol = t == DType::f32 ? 2e-6 : 8e-3;
    double worst = 0;
    for (std::int64_t pos : {T - 1, T - 2, T / 2 + 1, std::int64_t{1}})
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < half; ++i) {
          const long double a = static_cast<long double>(pos) *
                                std::pow(static_cast<long double>(theta), -2.0L * static_cast<long double>(i) / Dh);
          const std::size_t e = static_cast<std::size_t>(((pos * H) + h) * Dh + 2 * i);
          const long double x0 = x[e], x1 = x[e + 1];
          const long double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x0 * std::sin(a) + x1 * std::cos(a);
          const double norm = std::sqrt(static_cast<double>(x0 * x0 + x1 * x1)) + 1e-30;
          const double err = std::hypot(got[e] - static_cast<double>(r0), got[e + 1] - static_cast<double>(r1)) / norm;
          worst = std::max(worst, err);
          if (pos == T - 1) {
            EXPECT_LT(err, tol) << "pair " << i << " head " << h;
          }
        }
    EXPECT_LT(worst, tol);
    // The inverse rotation (the backward) brings position 32767 back.
    ops::rope(g(), xd, B, T, H, Dh, theta, true);
    const auto back = values(xd);
    std::vector<double> last(back.end() - H * Dh, back.end()), orig(x.end() - H * Dh, x.end());
    EXPECT_CLOSE(last, orig, t == DType::f32 ? 4e-6 : 2e-2);
  }
}

}  // namespace
}  // namespace lmscale::test
