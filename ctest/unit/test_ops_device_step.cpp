// ops::clip_grad_scale (ops/device_step.h) on the CPU: the device-side clip of a captured step
// (train.cuda_graphs) must give bitwise what the eager step computes on the host from the same
// gradients: optim::sum_of_squares (its partials summed in index order in double), the norm
// sqrt(sum) / loss scale, and inv_scale * optim::clip_factor(norm, max_norm). The CUDA kernel is
// held to the same values in ctest/gpu/test_cuda_graph_step.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lmscale/ops/device_step.h"
#include "lmscale/optim/grad_clip.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

class DeviceStepTest : public OpsTest {
 protected:
  // The eager step's host arithmetic (jobs/engine/trainer.cpp) from the same parts.
  struct Host {
    double norm, grad_scale;
    bool finite;
  };
  Host host_clip(const std::vector<Tensor>& parts, double inv_scale, double max_norm) {
    const double norm = std::sqrt(optim::sum_of_squares(ctx, parts)) * inv_scale;
    return {norm, inv_scale * optim::clip_factor(norm, max_norm), std::isfinite(norm)};
  }
  std::vector<double> device_clip(const std::vector<Tensor>& parts, double inv_scale, double max_norm) {
    Tensor partials = optim::sum_of_squares_parts(ctx, parts);
    Tensor out = poisoned({ops::kClipSlots});
    ops::clip_grad_scale(ctx, partials, inv_scale, max_norm, out);
    return values(out);
  }
  static bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
};

TEST_F(DeviceStepTest, MatchesTheHostClipBitwise) {
  int clipped = 0, unclipped = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    // 5 gradient buckets of uneven sizes and scales; fp16-style loss scales and clip limits around
    // the norm, so both branches of clip_factor run.
    std::vector<Tensor> parts;
    for (int b = 0; b < 5; ++b)
      parts.push_back(randn({17 + 13 * b + static_cast<std::int64_t>(seed % 7)}, seed * 10 + b, 0.01 * (b + 1)));
    const double inv_scale = seed % 3 == 0 ? 1.0 / 65536.0 : (seed % 3 == 1 ? 1.0 : 1.0 / 3.0);
    const double norm0 = host_clip(parts, inv_scale, 0.0).norm;
    const double max_norm = seed % 4 == 0 ? 0.0 : norm0 * (0.5 + 0.05 * static_cast<double>(seed % 20));
    const Host h = host_clip(parts, inv_scale, max_norm);
    const std::vector<double> d = device_clip(parts, inv_scale, max_norm);
    EXPECT_TRUE(same_bits(d[ops::kClipNorm], h.norm)) << seed << ": " << d[ops::kClipNorm] << " vs " << h.norm;
    EXPECT_TRUE(same_bits(d[ops::kClipGradScale], h.grad_scale))
        << seed << ": " << d[ops::kClipGradScale] << " vs " << h.grad_scale;
    EXPECT_EQ(d[ops::kClipFinite], 1.0);
    (h.grad_scale == inv_scale ? unclipped : clipped) += 1;
  }
  EXPECT_GT(clipped, 5);     // the test ran both branches
  EXPECT_GT(unclipped, 5);
}

// fp32 partials, as the CUDA sum_squares writes them: each widened to double before the sum.
TEST_F(DeviceStepTest, Fp32PartialsAreWidenedBeforeTheSum) {
  Tensor partials = as(randn({33}, 5, 1.0, 3.0), DType::f32);
  Tensor out = poisoned({ops::kClipSlots});
  ops::clip_grad_scale(ctx, partials, 0.5, 1.0, out);
  double total = 0;
  for (std::int64_t i = 0; i < 33; ++i) total += static_cast<double>(partials.data_as<float>()[i]);
  const double norm = std::sqrt(total) * 0.5;
  EXPECT_TRUE(same_bits(values(out)[ops::kClipNorm], norm));
  EXPECT_TRUE(same_bits(values(out)[ops::kClipGradScale], 0.5 * optim::clip_factor(norm, 1.0)));
}

TEST_F(DeviceStepTest, NonFiniteNormClearsTheFiniteFlag) {
  for (const double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Tensor g = randn({64}, 3);
    g.data_as<double>()[7] = bad;
    const std::vector<double> d = device_clip({g, randn({8}, 4)}, 1.0 / 1024, 1.0);
    EXPECT_EQ(d[ops::kClipFinite], 0.0) << bad;
    EXPECT_FALSE(std::isfinite(d[ops::kClipNorm]));
  }
}

TEST_F(DeviceStepTest, RefusesAWrongOutput) {
  Tensor partials = randn({4}, 1);
  Tensor small = poisoned({2});
  EXPECT_THROW(ops::clip_grad_scale(ctx, partials, 1.0, 1.0, small), Error);
  Tensor f32 = poisoned({ops::kClipSlots}, DType::f32);
  EXPECT_THROW(ops::clip_grad_scale(ctx, partials, 1.0, 1.0, f32), Error);
}

// The scalars of a captured AdamW step live on a GPU; the CPU path refuses them by name.
TEST_F(DeviceStepTest, DeviceScalarsAreCudaOnly) {
  Tensor scalars = poisoned({ops::kAdamWScalars}, DType::f32);
  ops::AdamWStep a;
  EXPECT_THROW(ops::adamw_upload_scalars(ctx, a, scalars), Error);
  Tensor clip = poisoned({ops::kClipSlots});
  a.device_scalars = &scalars;
  a.device_clip = &clip;
  Tensor p = randn({16}, 1), g = randn({16}, 2), m = zeros({16}), v = zeros({16});
  EXPECT_THROW(ops::adamw(ctx, p, g, m, v, a, nullptr), Error);
}

}  // namespace
}  // namespace lmscale::test
