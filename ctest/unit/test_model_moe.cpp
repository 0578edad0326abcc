// The mixture-of-experts Transformer on the CPU (docs/moe.md): the float64 model's gradient
// against central differences through the router, the gates and the experts (dropless and with
// capacity drops, every block MoE and every other block), the fp32 path against the float64
// reference, gradient accumulation over micro-batches equal to one batch (the router losses and
// the capacity are per sequence), the routing statistics, and expert-parallel parameter slices.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lmscale/core/error.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/tensor_parallel.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"
#include "model_test_util.h"

using namespace lmscale;

namespace {

model::ModelDims tiny_moe(double capacity, std::int64_t every) {
  model::ModelDims d;
  d.vocab = 11;
  d.context = 6;
  d.d_model = 8;
  d.d_ff = 12;
  d.layers = 2;
  d.heads = 2;
  d.moe_experts = 4;
  d.moe_top_k = 2;
  d.moe_dff = 6;
  d.moe_every = every;
  d.moe_capacity_factor = capacity;
  d.moe_aux_loss = 0.1;   // large enough that their gradients show in the check
  d.moe_z_loss = 0.05;
  return d;
}

using Fixture = test::CpuFixture;
using test::int_tensor;

double as_double(const Tensor& t, std::int64_t i) {
  return t.dtype() == DType::f64 ? t.data_as<double>()[i] : t.data_as<float>()[i];
}

struct Case {
  double capacity;
  std::int64_t every;
  const char* name;
};

class MoeModelGradient : public ::testing::TestWithParam<Case> {};

TEST_P(MoeModelGradient, MatchesCentralDifferencesInFloat64) {
  Fixture f;
  const model::ModelDims d = tiny_moe(GetParam().capacity, GetParam().every);
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(3, f.ctx);
  model::TransformerLM m(d, ps);
  const std::int64_t B = 2, T = 5;
  Tensor x = int_tensor(f.alloc, B, T, d.vocab, 1), y = int_tensor(f.alloc, B, T, d.vocab, 2);
  const double scale = 1.0 / static_cast<double>(B * T);
  auto act = m.forward(f.ctx, x, y, true, scale);
  m.backward(f.ctx, *act, {});
  // Drops happen in the capacity case (else the check would not cover them).
  std::int64_t routed = 0, kept = 0;
  for (const auto& st : m.moe_stats(f.ctx))
    for (std::size_t e = 0; e < st.routed.size(); ++e) routed += st.routed[e], kept += st.kept[e];
  EXPECT_EQ(routed, B * T * d.moe_top_k * d.moe_block_count());
  if (GetParam().capacity > 0) EXPECT_LT(kept, routed);
  else EXPECT_EQ(kept, routed);
  auto loss = [&] { return m.forward(f.ctx, x, y, false, scale)->loss_sum.data_as<double>()[0] * scale; };
  double* p = ps.flat_params().data_as<double>();
  const double* g = ps.flat_grads().data_as<double>();
  std::mt19937 rng(5);
  int checked = 0;
  for (const auto& info : ps.infos()) {
    const int samples = info.name.find("ffn.") != std::string::npos ? 12 : 3;
    for (int s = 0; s < samples; ++s) {
      const std::int64_t i = info.offset + static_cast<std::int64_t>(rng() % static_cast<unsigned>(info.numel));
      const double h = 1e-5, keep = p[i];
      p[i] = keep + h;
      const double lp = loss();
      p[i] = keep - h;
      const double lm = loss();
      p[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-8 + 1e-6 * std::fabs(fd)) << info.name << " element " << i - info.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, 3 * ps.size());
}

INSTANTIATE_TEST_SUITE_P(DroplessAndDrops, MoeModelGradient,
                         ::testing::Values(Case{0.0, 1, "dropless"}, Case{0.5, 1, "capacity_half"},
                                           Case{0.0, 2, "every_other_block"}),
                         [](const auto& i) { return std::string(i.param.name); });

// The router losses are in the loss: with both coefficients 0 the loss drops by their terms.
TEST(MoeModel, RouterLossesAreAddedWithTheirCoefficients) {
  Fixture f;
  model::ModelDims d = tiny_moe(0.0, 1);
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(3, f.ctx);
  Tensor x = int_tensor(f.alloc, 2, 5, d.vocab, 1), y = int_tensor(f.alloc, 2, 5, d.vocab, 2);
  model::TransformerLM with(d, ps);
  auto a = with.forward(f.ctx, x, y, true, 0.1);
  double balance = 0, z = 0;
  for (const auto& st : with.moe_stats(f.ctx)) balance += st.balance_sum, z += st.z_sum;
  EXPECT_GT(balance, 0);
  EXPECT_GT(z, 0);
  model::ModelDims plain = d;
  plain.moe_aux_loss = plain.moe_z_loss = 0;
  model::TransformerLM without(plain, ps);
  auto b = without.forward(f.ctx, x, y, false, 0.1);
  EXPECT_NEAR(a->loss_sum.data_as<double>()[0] - b->loss_sum.data_as<double>()[0], 0.1 * balance + 0.05 * z, 1e-12);
}

// model.moe_expert_gemm reaches the model's dims (loop by default); on the CPU the grouped form
// runs the loop, so the loss is the loop's bit for bit.
TEST(MoeModel, ExpertGemmKeyReachesTheModelAndTheCpuLoops) {
  ModelConfig cfg;
  cfg.moe_experts = 4;
  EXPECT_EQ(model::ModelDims::from(cfg).moe_expert_gemm, ops::ExpertGemm::loop);
  cfg.moe_expert_gemm = MoeExpertGemm::grouped;
  EXPECT_EQ(model::ModelDims::from(cfg).moe_expert_gemm, ops::ExpertGemm::grouped);
  Fixture f;
  model::ModelDims d = tiny_moe(0.0, 1);
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(5, f.ctx);
  Tensor x = int_tensor(f.alloc, 2, 5, d.vocab, 1), y = int_tensor(f.alloc, 2, 5, d.vocab, 2);
  model::TransformerLM loop(d, ps);
  const double want = loop.forward(f.ctx, x, y, false, 0.1)->loss_sum.data_as<double>()[0];
  d.moe_expert_gemm = ops::ExpertGemm::grouped;
  model::TransformerLM grouped(d, ps);
  EXPECT_EQ(grouped.forward(f.ctx, x, y, false, 0.1)->loss_sum.data_as<double>()[0], want);
}

// fp32 (the run path) against the float64 reference: loss and every gradient.
TEST(MoeModel, Fp32MatchesTheFloat64Reference) {
  for (double capacity : {0.0, 0.5}) {
    Fixture f;
    const model::ModelDims d = tiny_moe(capacity, 1);
    Tensor x = int_tensor(f.alloc, 3, 6, d.vocab, 7), y = int_tensor(f.alloc, 3, 6, d.vocab, 8);
    std::vector<double> loss(2);
    std::vector<std::vector<double>> grads(2);
    int i = 0;
    for (DType t : {DType::f64, DType::f32}) {
      model::ParameterStore ps(d, t, t, f.alloc);
      ps.init(3, f.ctx);
      model::TransformerLM m(d, ps);
      auto a = m.forward(f.ctx, x, y, true, 1.0 / 18);
      m.backward(f.ctx, *a, {});
      loss[static_cast<std::size_t>(i)] = as_double(a->loss_sum, 0);
      for (std::int64_t j = 0; j < ps.numel(); ++j) grads[static_cast<std::size_t>(i)].push_back(as_double(ps.flat_grads(), j));
      ++i;
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::fabs(loss[0])) << capacity;
    double num = 0, den = 0;
    for (std::size_t j = 0; j < grads[0].size(); ++j) {
      num = std::max(num, std::fabs(grads[1][j] - grads[0][j]));
      den = std::max(den, std::fabs(grads[0][j]));
    }
    EXPECT_LT(num / den, 1e-5) << capacity;
  }
}

// Two micro-batches of 2 sequences give the gradient of one batch of 4: the balance loss and the
// capacity are per sequence, so the split does not change them (also what makes data and expert
// parallelism agree with one process).
TEST(MoeModel, AccumulationOverMicroBatchesEqualsOneBatch) {
  for (double capacity : {0.0, 0.5}) {
    Fixture f;
    const model::ModelDims d = tiny_moe(capacity, 1);
    model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
    ps.init(3, f.ctx);
    model::TransformerLM m(d, ps);
    Tensor x = int_tensor(f.alloc, 4, 5, d.vocab, 1), y = int_tensor(f.alloc, 4, 5, d.vocab, 2);
    const double scale = 1.0 / 20.0;
    auto a = m.forward(f.ctx, x, y, true, scale);
    const double whole_loss = a->loss_sum.data_as<double>()[0];
    m.backward(f.ctx, *a, {});
    std::vector<double> whole(ps.flat_grads().data_as<double>(), ps.flat_grads().data_as<double>() + ps.numel());
    ps.zero_grads(f.ctx);
    double split_loss = 0;
    for (int half = 0; half < 2; ++half) {
      auto b = m.forward(f.ctx, x.slice(2 * half, 2 * half + 2), y.slice(2 * half, 2 * half + 2), true, scale);
      split_loss += b->loss_sum.data_as<double>()[0];
      m.backward(f.ctx, *b, {});
    }
    EXPECT_NEAR(split_loss, whole_loss, 1e-12 * std::fabs(whole_loss));
    const double* g = ps.flat_grads().data_as<double>();
    for (std::int64_t i = 0; i < ps.numel(); ++i) EXPECT_NEAR(g[i], whole[static_cast<std::size_t>(i)], 1e-13) << i;
  }
}

// Activation checkpointing (every-k) recomputes the routing: the same gradients.
TEST(MoeModel, EveryKCheckpointingGivesTheSameGradients) {
  Fixture f;
  const model::ModelDims d = tiny_moe(0.5, 1);
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(3, f.ctx);
  Tensor x = int_tensor(f.alloc, 2, 5, d.vocab, 1), y = int_tensor(f.alloc, 2, 5, d.vocab, 2);
  std::vector<std::vector<double>> grads;
  for (bool ck : {false, true}) {
    model::TransformerLM m(d, ps);
    if (ck) m.set_recompute(model::RecomputePolicy::from(Checkpointing::every_k, 1));
    auto a = m.forward(f.ctx, x, y, true, 0.1, {}, false);
    m.backward(f.ctx, *a, {}, false);
    grads.emplace_back(ps.flat_grads().data_as<double>(), ps.flat_grads().data_as<double>() + ps.numel());
    EXPECT_EQ(m.moe_stats(f.ctx)[0].tokens, 10);   // the recompute does not count again
  }
  for (std::size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[1][i], grads[0][i]) << i;
}

// An expert-parallel rank's store holds its experts' rows of each stacked tensor, with the full
// model's initial values.
TEST(MoeModel, ExpertParallelSlicesHoldTheirExperts) {
  Fixture f;
  const model::ModelDims d = tiny_moe(0.0, 1);
  model::ParameterStore full(d, DType::f64, DType::f64, f.alloc);
  full.init(3, f.ctx);
  for (int r = 0; r < 2; ++r) {
    model::ParameterStore part(d, DType::f64, DType::f64, f.alloc, model::ParameterStore::Buffers::params_and_grads, {},
                               {model::StageUnits::all()}, model::ExpertSplit{2, r});
    part.init(3, f.ctx);
    ASSERT_EQ(part.size(), full.size());
    for (int i = 0; i < part.size(); ++i) {
      const auto& pi = part.infos()[static_cast<std::size_t>(i)];
      const auto& fi = full.infos()[static_cast<std::size_t>(i)];
      ASSERT_EQ(pi.name, fi.name);
      const std::int64_t skip = model::is_expert_parameter(pi) ? r * pi.numel : 0;
      if (model::is_expert_parameter(pi)) EXPECT_EQ(pi.shape[0], 2) << pi.name;
      for (std::int64_t j = 0; j < pi.numel; ++j)
        ASSERT_EQ(part.flat_params().data_as<double>()[pi.offset + j], full.flat_params().data_as<double>()[fi.offset + skip + j])
            << pi.name;
    }
  }
}

}  // namespace
