// The Transformer LM on CPU in float64: parameter layout (names, shapes, count), deterministic
// shard-independent init, a finite-difference check of the whole model's gradient (naive and
// flash attention), gradient accumulation, and the initial loss on uniform tokens (~ ln V).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/tensor_parallel.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"
#include "model_test_util.h"

using namespace lmscale;

namespace {

model::ModelDims tiny(bool flash) {
  model::ModelDims d;
  d.vocab = 11;
  d.context = 6;
  d.d_model = 8;
  d.d_ff = 12;
  d.layers = 2;
  d.heads = 2;
  d.flash = flash;
  return d;
}

using Fixture = test::CpuFixture;
using test::int_tensor;

double loss_of(Context& ctx, model::TransformerLM& m, const Tensor& x, const Tensor& y) {
  auto act = m.forward(ctx, x, y, false, 1.0);
  return act->loss_sum.data_as<double>()[0] / static_cast<double>(x.numel());
}

}  // namespace

TEST(ModelLayout, NamesShapesAndCount) {
  model::ModelDims d = tiny(false);
  auto layout = model::parameter_layout(d);
  ASSERT_EQ(layout.size(), static_cast<std::size_t>(3 + 9 * d.layers));
  EXPECT_EQ(layout[0].name, "token_embeddings.weight");
  EXPECT_EQ(layout[0].shape, (Shape{d.vocab, d.d_model}));
  EXPECT_EQ(layout[1].name, "layers.0.attn.q_proj.weight");
  EXPECT_EQ(layout[6].name, "layers.0.ffn.w1.weight");
  EXPECT_EQ(layout[6].shape, (Shape{d.d_ff, d.d_model}));
  // w3 before w2 (docs/architecture.md §2): w1 and w3 back to back, one GEMM each way.
  EXPECT_EQ(layout[7].name, "layers.0.ffn.w3.weight");
  EXPECT_EQ(layout[7].offset, layout[6].offset + layout[6].numel);
  EXPECT_EQ(layout[8].name, "layers.0.ffn.w2.weight");
  EXPECT_EQ(layout[8].shape, (Shape{d.d_model, d.d_ff}));
  EXPECT_EQ(layout[9].name, "layers.0.ln2.weight");
  EXPECT_EQ(layout.back().name, "lm_head.weight");
  std::int64_t total = 0;
  for (const auto& p : layout) {
    EXPECT_EQ(p.offset, total) << p.name;
    total += p.numel;
  }
  EXPECT_EQ(total, d.parameter_count());
  // xl from docs/architecture.md §2: 1600/6400/48/25, vocab 10000
  model::ModelDims xl;
  xl.vocab = 10000;
  xl.d_model = 1600;
  xl.d_ff = 6400;
  xl.layers = 48;
  xl.heads = 25;
  EXPECT_EQ(xl.parameter_count(), 10000LL * 1600 * 2 + 48LL * (4 * 1600 * 1600 + 3 * 1600 * 6400 + 2 * 1600) + 1600);
}

TEST(ModelInit, DeterministicAndShardIndependent) {
  model::ModelDims d = tiny(false);
  auto layout = model::parameter_layout(d);
  for (const auto& p : layout) {
    std::vector<double> full(static_cast<std::size_t>(p.numel)), part(static_cast<std::size_t>(p.numel));
    model::initial_values(p, 7, 0, p.numel, full.data());
    const std::int64_t cut = p.numel / 3;
    model::initial_values(p, 7, 0, cut, part.data());
    model::initial_values(p, 7, cut, p.numel, part.data() + cut);
    EXPECT_EQ(full, part) << p.name;
    std::vector<double> other(full.size());
    model::initial_values(p, 8, 0, p.numel, other.data());
    if (p.kind != model::ParamInfo::Kind::norm) {
      EXPECT_NE(full, other) << p.name;
    }
    double bound = 3.0;
    if (p.kind == model::ParamInfo::Kind::linear) bound = 3.0 * std::sqrt(2.0 / static_cast<double>(p.shape[0] + p.shape[1]));
    for (double v : full) {
      if (p.kind == model::ParamInfo::Kind::norm) {
        EXPECT_EQ(v, 1.0);
      } else {
        EXPECT_LE(std::fabs(v), bound + 1e-12);
      }
    }
  }
}

// FSDP over tensor-parallel slices initialises ranges of a slice that may start and end inside a
// row of a row-parallel (column-split) slice: every range equals the same elements of the whole
// slice's values, which are the full parameter's at the slice's positions.
TEST(ModelInit, RangesOfTensorParallelSlicesMatchTheWholeSlice) {
  model::ModelDims d = tiny(false);
  d.vocab = 12;
  Fixture f;
  for (int rank = 0; rank < 2; ++rank) {
    model::TensorSplit split;
    split.degree = 2;
    split.rank = rank;
    for (const auto& p : model::tensor_parallel_layout(d, split)) {
      Tensor whole = Tensor::empty({p.numel}, DType::f64, f.alloc);
      model::fill_slice_initial_values(p, 7, whole, f.ctx);
      // The full parameter's values at the slice's positions (copy_slice: the reference mapping).
      std::vector<double> full(static_cast<std::size_t>(shape_numel(p.full_shape.empty() ? p.shape : p.full_shape)));
      model::initial_values(p, 7, 0, static_cast<std::int64_t>(full.size()), full.data());
      std::vector<double> expect(static_cast<std::size_t>(p.numel));
      model::copy_slice(p, full.data(), expect.data(), sizeof(double), false);
      for (std::int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(whole.data_as<double>()[i], expect[static_cast<std::size_t>(i)]) << p.name;
      // Ranges cut anywhere (inside rows too), including empty ones.
      const std::int64_t cuts[] = {0, 1, p.numel / 3, p.numel / 2 + 1, p.numel - 1, p.numel};
      for (std::int64_t a : cuts)
        for (std::int64_t b : cuts) {
          if (a > b || b > p.numel || a < 0) continue;
          Tensor part = Tensor::empty({b - a}, DType::f64, f.alloc);
          model::fill_slice_initial_values(p, 7, a, b, part, f.ctx);
          for (std::int64_t i = a; i < b; ++i)
            ASSERT_EQ(part.data_as<double>()[i - a], expect[static_cast<std::size_t>(i)]) << p.name << " [" << a << ", " << b << ")";
        }
    }
  }
}

TEST(ModelInit, TruncatedNormalStatistics) {
  // std of a N(0,1) truncated at +-3: sqrt(1 - 6 phi(3) / (2 Phi(3) - 1)) = 0.98658
  model::ParamInfo p;
  p.name = "token_embeddings.weight";
  p.kind = model::ParamInfo::Kind::embedding;
  p.shape = {1000, 200};
  p.numel = 200000;
  std::vector<double> v(200000);
  model::initial_values(p, 1, 0, p.numel, v.data());
  double s = 0, ss = 0;
  for (double x : v) { s += x; ss += x * x; }
  const double mean = s / 200000.0, sd = std::sqrt(ss / 200000.0 - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sd, 0.98658, 0.01);
}

class ModelGradient : public ::testing::TestWithParam<bool> {};

TEST_P(ModelGradient, MatchesCentralDifferencesInFloat64) {
  Fixture f;
  model::ModelDims d = tiny(GetParam());
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(3, f.ctx);
  model::TransformerLM m(d, ps);
  const std::int64_t B = 2, T = 5;
  Tensor x = int_tensor(f.alloc, B, T, d.vocab, 1), y = int_tensor(f.alloc, B, T, d.vocab, 2);
  auto act = m.forward(f.ctx, x, y, true, 1.0 / static_cast<double>(B * T));
  m.backward(f.ctx, *act, {});
  double* p = ps.flat_params().data_as<double>();
  const double* g = ps.flat_grads().data_as<double>();
  std::mt19937 rng(5);
  int checked = 0;
  for (const auto& info : ps.infos()) {
    for (int k = 0; k < 4; ++k) {
      const std::int64_t i = info.offset + static_cast<std::int64_t>(rng() % static_cast<unsigned>(info.numel));
      const double h = 1e-5, keep = p[i];
      p[i] = keep + h;
      const double lp = loss_of(f.ctx, m, x, y);
      p[i] = keep - h;
      const double lm = loss_of(f.ctx, m, x, y);
      p[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-7 + 1e-6 * std::fabs(fd)) << info.name << " element " << i - info.offset;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * ps.size());
}

INSTANTIATE_TEST_SUITE_P(NaiveAndFlash, ModelGradient, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "flash" : "naive"; });

TEST(ModelGradient, AccumulationOverMicroBatchesEqualsOneBatch) {
  Fixture f;
  model::ModelDims d = tiny(false);
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(3, f.ctx);
  model::TransformerLM m(d, ps);
  Tensor x = int_tensor(f.alloc, 4, 5, d.vocab, 1), y = int_tensor(f.alloc, 4, 5, d.vocab, 2);
  const double scale = 1.0 / 20.0;
  auto a = m.forward(f.ctx, x, y, true, scale);
  m.backward(f.ctx, *a, {});
  std::vector<double> whole(ps.flat_grads().data_as<double>(), ps.flat_grads().data_as<double>() + ps.numel());
  ps.zero_grads(f.ctx);
  for (int half = 0; half < 2; ++half) {
    auto b = m.forward(f.ctx, x.slice(2 * half, 2 * half + 2), y.slice(2 * half, 2 * half + 2), true, scale);
    m.backward(f.ctx, *b, {});
  }
  const double* g = ps.flat_grads().data_as<double>();
  for (std::int64_t i = 0; i < ps.numel(); ++i) EXPECT_NEAR(g[i], whole[static_cast<std::size_t>(i)], 1e-13);
}

TEST(ModelGradient, GradReadyHookFiresOncePerParameterAfterItsGradient) {
  Fixture f;
  model::ModelDims d = tiny(false);
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(3, f.ctx);
  model::TransformerLM m(d, ps);
  Tensor x = int_tensor(f.alloc, 2, 5, d.vocab, 1), y = int_tensor(f.alloc, 2, 5, d.vocab, 2);
  std::vector<int> order;
  std::vector<double> snap(static_cast<std::size_t>(ps.numel()));
  model::ParallelContext pc;
  pc.on_grad_ready = [&](int i) {
    order.push_back(i);
    const auto& info = ps.infos()[static_cast<std::size_t>(i)];
    std::copy_n(ps.flat_grads().data_as<double>() + info.offset, info.numel, snap.begin() + info.offset);
  };
  // The head's gradients are final in the forward (fused head): the same hooks go to both.
  auto a = m.forward(f.ctx, x, y, true, 0.1, pc);
  EXPECT_EQ(order.size(), 2u);   // lm_head and ln_final
  m.backward(f.ctx, *a, pc);
  ASSERT_EQ(static_cast<int>(order.size()), ps.size());
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < ps.size(); ++i) EXPECT_EQ(sorted[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(order.front(), ps.size() - 1);   // lm_head first
  EXPECT_EQ(order.back(), 0);                // token embeddings last
  // the gradient seen when the hook fired is the final one
  for (std::int64_t i = 0; i < ps.numel(); ++i) EXPECT_EQ(snap[static_cast<std::size_t>(i)], ps.flat_grads().data_as<double>()[i]);
}

TEST(ModelLoss, InitialLossOnUniformTokensIsNearLnV) {
  Fixture f;
  model::ModelDims d;
  d.vocab = 1000;
  d.context = 32;
  d.d_model = 64;
  d.d_ff = 172;
  d.layers = 2;
  d.heads = 4;
  model::ParameterStore ps(d, DType::f32, DType::f32, f.alloc);
  ps.init(11, f.ctx);
  model::TransformerLM m(d, ps);
  Tensor x = int_tensor(f.alloc, 4, 32, d.vocab, 3), y = int_tensor(f.alloc, 4, 32, d.vocab, 4);
  auto act = m.forward(f.ctx, x, y, false, 1.0);
  const double loss = act->loss_sum.data_as<float>()[0] / 128.0;
  EXPECT_NEAR(loss, std::log(1000.0), 0.2);
}

TEST(ModelGradient, OverwriteModeIgnoresStaleGradients) {
  // backward(accumulate = false) must give the same gradients over a buffer full of garbage as
  // backward(accumulate = true) over a zeroed one (the trainer's first micro-batch).
  Fixture f;
  model::ModelDims d = tiny(true);
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(3, f.ctx);
  model::TransformerLM m(d, ps);
  Tensor x = int_tensor(f.alloc, 2, 5, d.vocab, 1), y = int_tensor(f.alloc, 2, 5, d.vocab, 2);
  auto a = m.forward(f.ctx, x, y, true, 0.1);
  m.backward(f.ctx, *a, {});
  std::vector<double> ref(ps.flat_grads().data_as<double>(), ps.flat_grads().data_as<double>() + ps.numel());
  ops::fill(f.ctx, ps.flat_grads(), 12345.0);
  auto b = m.forward(f.ctx, x, y, true, 0.1, {}, false);
  m.backward(f.ctx, *b, {}, false);
  // forward and backward must agree on accumulate (the head's gradients are written in the forward)
  auto c = m.forward(f.ctx, x, y, true, 0.1, {}, false);
  EXPECT_THROW(m.backward(f.ctx, *c, {}, true), Error);
  for (std::int64_t i = 0; i < ps.numel(); ++i) EXPECT_EQ(ps.flat_grads().data_as<double>()[i], ref[static_cast<std::size_t>(i)]) << i;
}

// The fused LM head + cross-entropy in row chunks (model.ce_chunk_rows) against one chunk (the
// unfused ops): losses and every gradient of the whole model, fp64 to 1e-13 and fp32 to 1e-6
// relative, chunk sizes of one row, a remainder chunk (10 rows in chunks of 3 and 4) and one chunk.
TEST(ModelChunkedHead, LossAndGradientsMatchOneChunk) {
  for (DType t : {DType::f64, DType::f32}) {
    auto run = [&](std::int64_t chunk, double& loss) {
      Fixture f;
      model::ModelDims d = tiny(true);
      d.ce_chunk_rows = chunk;
      model::ParameterStore ps(d, t, t, f.alloc);
      ps.init(3, f.ctx);
      model::TransformerLM m(d, ps);
      Tensor x = int_tensor(f.alloc, 2, 5, d.vocab, 1), y = int_tensor(f.alloc, 2, 5, d.vocab, 2);
      auto a = m.forward(f.ctx, x, y, true, 0.1, {}, false);
      loss = t == DType::f64 ? a->loss_sum.data_as<double>()[0] : a->loss_sum.data_as<float>()[0];
      m.backward(f.ctx, *a, {}, false);
      std::vector<double> g(static_cast<std::size_t>(ps.numel()));
      for (std::int64_t i = 0; i < ps.numel(); ++i)
        g[static_cast<std::size_t>(i)] =
            t == DType::f64 ? ps.flat_grads().data_as<double>()[i] : ps.flat_grads().data_as<float>()[i];
      // A forward without gradients (evaluation) gives the same loss.
      auto e = m.forward(f.ctx, x, y, false, 1.0);
      const double le = t == DType::f64 ? e->loss_sum.data_as<double>()[0] : e->loss_sum.data_as<float>()[0];
      EXPECT_EQ(le, loss);
      return g;
    };
    double l0 = 0;
    const auto g0 = run(0, l0);
    const double tol = t == DType::f64 ? 1e-13 : 1e-6;
    double gmax = 0;
    for (double v : g0) gmax = std::max(gmax, std::fabs(v));
    for (std::int64_t chunk : {std::int64_t{1}, std::int64_t{3}, std::int64_t{4}, std::int64_t{10}, std::int64_t{-1}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " ce_chunk_rows " << chunk);
      double l = 0;
      const auto g = run(chunk, l);
      EXPECT_NEAR(l, l0, tol * std::fabs(l0));
      std::size_t bad = 0;
      for (std::size_t i = 0; i < g.size(); ++i) bad += std::fabs(g[i] - g0[i]) > tol * gmax;
      EXPECT_EQ(bad, 0u);
      if (chunk == 10 || chunk == -1) {   // one chunk (auto: 10 rows of 11 logits are far below 256 MiB)
        EXPECT_EQ(l, l0);
        EXPECT_EQ(g, g0);
      }
    }
  }
}

TEST(ModelChunkedHead, GradientMatchesCentralDifferencesWithARemainderChunk) {
  Fixture f;
  model::ModelDims d = tiny(false);
  d.ce_chunk_rows = 4;   // 10 rows: 4 + 4 + 2
  model::ParameterStore ps(d, DType::f64, DType::f64, f.alloc);
  ps.init(5, f.ctx);
  model::TransformerLM m(d, ps);
  const std::int64_t B = 2, T = 5;
  Tensor x = int_tensor(f.alloc, B, T, d.vocab, 3), y = int_tensor(f.alloc, B, T, d.vocab, 4);
  auto act = m.forward(f.ctx, x, y, true, 1.0 / static_cast<double>(B * T));
  m.backward(f.ctx, *act, {});
  double* p = ps.flat_params().data_as<double>();
  const double* g = ps.flat_grads().data_as<double>();
  std::mt19937 rng(9);
  for (const auto& info : ps.infos()) {
    for (int k = 0; k < 3; ++k) {
      const std::int64_t i = info.offset + static_cast<std::int64_t>(rng() % static_cast<unsigned>(info.numel));
      const double h = 1e-5, keep = p[i];
      p[i] = keep + h;
      const double lp = loss_of(f.ctx, m, x, y);
      p[i] = keep - h;
      const double lm = loss_of(f.ctx, m, x, y);
      p[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-7 + 1e-6 * std::fabs(fd)) << info.name;
    }
  }
}

// The 8B deck's vocabulary (issue 14): on uniform random tokens the loss at initialisation is
// ln(151936) = 11.93 within 0.1 (the head runs in several auto-sized chunks here: 1024 rows).
TEST(ModelLoss, InitialLossWithThe8bVocabularyIsNearLn151936) {
  Fixture f;
  model::ModelDims d;
  d.vocab = 151936;
  d.context = 512;
  d.d_model = 64;
  d.d_ff = 172;
  d.layers = 2;
  d.heads = 32;   // the 8B model's head count (head dim 2 here)
  model::ParameterStore ps(d, DType::f32, DType::f32, f.alloc);
  ps.init(14, f.ctx);
  model::TransformerLM m(d, ps);
  ASSERT_LT(d.head_chunk_rows(1024, d.vocab, 4), 1024);
  Tensor x = int_tensor(f.alloc, 2, 512, d.vocab, 5), y = int_tensor(f.alloc, 2, 512, d.vocab, 6);
  auto act = m.forward(f.ctx, x, y, false, 1.0);
  const double loss = act->loss_sum.data_as<float>()[0] / 1024.0;
  EXPECT_NEAR(loss, std::log(151936.0), 0.1);
  EXPECT_NEAR(std::log(151936.0), 11.931, 1e-3);
}
