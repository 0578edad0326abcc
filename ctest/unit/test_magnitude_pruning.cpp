// Magnitude pruning (jobs/magnitude_pruning.h): the schedule's rounds and kept fractions, the
// exact sparsity of unstructured pruning (zeros counted), which parameters are pruned, and that
// a structurally pruned (compacted) model gives the masked model's loss in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lmscale/jobs/magnitude_pruning.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"

using namespace lmscale;
using namespace lmscale::jobs;

namespace {

model::ModelDims tiny() {
  model::ModelDims d;
  d.vocab = 13;
  d.context = 6;
  d.d_model = 8;
  d.d_ff = 12;
  d.layers = 2;
  d.heads = 2;
  return d;
}

std::vector<float> random_weights(const model::ModelDims& d, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  std::vector<float> w(static_cast<std::size_t>(d.parameter_count()));
  for (auto& x : w) x = n(g);
  return w;
}

// Mean loss in float64 of the model `d` with fp32 weights `w` (full layout) on fixed tokens.
double loss_f64(const model::ModelDims& d, const std::vector<float>& w) {
  HostAllocator a;
  Context ctx;
  ctx.device = Device::cpu;
  ctx.allocator = &a;
  ctx.host = &a;
  model::ParameterStore ps(d, DType::f64, DType::f64, a);
  for (const auto& p : ps.infos()) {
    Tensor src = Tensor::view(const_cast<float*>(w.data()) + p.offset, {p.numel}, DType::f32, Device::cpu);
    Tensor dst = ps.flat_params().flat_range(p.offset, p.numel);
    ops::cast(ctx, src, dst);
  }
  model::TransformerLM m(d, ps);
  const std::int64_t B = 3, T = d.context;
  Tensor x = Tensor::empty({B, T}, DType::i32, a), y = Tensor::empty({B, T}, DType::i32, a);
  std::mt19937 g(5);
  for (std::int64_t i = 0; i < B * T; ++i) {
    x.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(g() % d.vocab);
    y.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(g() % d.vocab);
  }
  auto act = m.forward(ctx, x, y, false, 1.0);
  return act->loss_sum.data_as<double>()[0] / static_cast<double>(B * T);
}

}  // namespace

TEST(PruneSchedule, GammaRoundsAndKeptFractions) {
  // theta rounds keep 1/10: gamma = 1 - 0.1^(1/theta).
  EXPECT_EQ(fixed_rounds(10, 0.9), 10);
  EXPECT_EQ(fixed_rounds(5, 0.9), 5);
  EXPECT_EQ(fixed_rounds(10, 0.99), 20);
  // 0.5 sparsity with theta 10: 0.1^(r/10) <= 0.5 from r = 10 log10 2 = 3.01 -> 4 rounds.
  EXPECT_EQ(fixed_rounds(10, 0.5), 4);
  EXPECT_NEAR(kept_fraction(1, 10, 0.9), std::pow(0.1, 0.1), 1e-15);
  EXPECT_NEAR(kept_fraction(3, 10, 0.9), std::pow(0.1, 0.3), 1e-15);
  EXPECT_DOUBLE_EQ(kept_fraction(10, 10, 0.9), 0.1);
  EXPECT_DOUBLE_EQ(kept_fraction(4, 10, 0.5), 0.5);   // clipped at 1 - target
  EXPECT_EQ(fixed_rounds(1, 0.3), 1);
}

TEST(PruneUnstructured, PrunesOnlyMatricesOfBlocksAndReachesExactSparsity) {
  const auto d = tiny();
  // q, k, v, o (d x d) and w1, w3 (F x d), w2 (d x F) per block; not embedding, head, norms.
  const std::int64_t expect = d.layers * (4 * d.d_model * d.d_model + 3 * d.d_model * d.d_ff);
  EXPECT_EQ(prunable_count(d), expect);
  for (const auto& p : prunable_parameters(d)) {
    EXPECT_GE(p.layer, 0) << p.name;
    EXPECT_EQ(p.name.find("ln"), std::string::npos) << p.name;
  }
  auto w = random_weights(d, 1);
  // Ties across layers must not change the count: duplicate a magnitude many times.
  for (std::size_t i = 0; i < w.size(); i += 7) w[i] = 0.125f;
  auto mask = full_mask(d);
  const std::int64_t n = prunable_count(d);
  for (double s : {0.3, 0.7, 0.9}) {
    const std::int64_t keep = n - std::llround(s * static_cast<double>(n));
    prune_unstructured(d, w, mask, keep);
    std::vector<float> pruned = w;
    apply_mask(pruned, mask);
    EXPECT_EQ(prunable_zeros(d, pruned), n - keep) << s;
    // Nothing outside the prunable set changed.
    const auto layout = model::parameter_layout(d);
    for (const auto& p : layout) {
      if (p.layer < 0 || p.name.find("ln") != std::string::npos) {
        for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i) ASSERT_EQ(pruned[i], w[i]) << p.name;
      }
    }
    // Global threshold: every pruned |w| <= every kept |w| in the set.
    float max_pruned = 0, min_kept = 1e30f;
    for (const auto& p : prunable_parameters(d))
      for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i)
        (mask[i] ? min_kept : max_pruned) =
            mask[i] ? std::min(min_kept, std::fabs(w[i])) : std::max(max_pruned, std::fabs(w[i]));
    EXPECT_LE(max_pruned, min_kept) << s;
  }
}

TEST(PruneStructured, CompactModelGivesTheMaskedModelsLoss) {
  const auto d = tiny();
  auto w = random_weights(d, 2);
  auto units = full_unit_mask(d);
  prune_units(d, w, units, 7);
  EXPECT_EQ(kept_units(units), 7);
  for (const auto& layer : units) EXPECT_EQ(std::count(layer.begin(), layer.end(), 1), 7);
  auto masked = w;
  apply_mask(masked, unit_element_mask(d, units));
  const auto small = compact_units(d, masked, units);
  model::ModelDims ds = d;
  ds.d_ff = 7;
  ASSERT_EQ(static_cast<std::int64_t>(small.size()), ds.parameter_count());
  EXPECT_LT(small.size(), masked.size());
  const double l_masked = loss_f64(d, masked), l_small = loss_f64(ds, small);
  EXPECT_NEAR(l_small, l_masked, 1e-12 * std::fabs(l_masked));
  // The unpruned model's loss differs (the test can fail).
  EXPECT_GT(std::fabs(loss_f64(d, w) - l_masked), 1e-6);
}

TEST(PruneStructured, RemovesTheUnitsWithTheSmallestL2Norm) {
  const auto d = tiny();
  auto w = random_weights(d, 3);
  // Make unit 4 of block 1 tiny in w1, w3 and w2: it must go first; unit 4 of block 0 stays large.
  for (const auto& p : model::parameter_layout(d)) {
    if (p.layer != 1) continue;
    if (p.name.find("ffn.w1") != std::string::npos || p.name.find("ffn.w3") != std::string::npos)
      for (std::int64_t i = 0; i < d.d_model; ++i) w[p.offset + 4 * d.d_model + i] = 1e-4f;
    if (p.name.find("ffn.w2") != std::string::npos)
      for (std::int64_t i = 0; i < d.d_model; ++i) w[p.offset + i * d.d_ff + 4] = 1e-4f;
  }
  auto units = full_unit_mask(d);
  prune_units(d, w, units, d.d_ff - 1);
  EXPECT_EQ(units[1][4], 0);
  EXPECT_EQ(std::count(units[1].begin(), units[1].end(), 0), 1);
}
