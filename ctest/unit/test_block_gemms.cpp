// The GEMM list of bench-gemm (jobs/block_gemms.h): the shapes of each layer's three products,
// and their FLOPs against the model's own count (6 FLOPs per matmul parameter per token).
#include <gtest/gtest.h>

#include <string>

#include "lmscale/jobs/block_gemms.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/model/parameter_store.h"

using namespace lmscale;
using namespace lmscale::jobs;

namespace {
model::ModelDims xl() {   // the xl preset: d 1600, F 6400, 48 layers, 25 heads, vocab 10000
  model::ModelDims d;
  d.d_model = 1600;
  d.d_ff = 6400;
  d.layers = 48;
  d.heads = 25;
  d.vocab = 10000;
  d.context = 1024;
  return d;
}
}  // namespace

TEST(BlockGemms, ShapesOfEachLayerAndPass) {
  const auto gemms = block_gemms(xl(), 8192);
  ASSERT_EQ(gemms.size(), 15u);
  struct Want {
    const char* layer;
    GemmPass pass;
    std::int64_t group, m, n, k;
    bool in_block;
  };
  const Want want[] = {
      {"qkv", GemmPass::forward, 3, 8192, 1600, 1600, true},   {"qkv", GemmPass::data_grad, 3, 8192, 1600, 1600, true},
      {"qkv", GemmPass::weight_grad, 3, 1600, 1600, 8192, true}, {"o", GemmPass::forward, 1, 8192, 1600, 1600, true},
      {"o", GemmPass::data_grad, 1, 8192, 1600, 1600, true},     {"o", GemmPass::weight_grad, 1, 1600, 1600, 8192, true},
      {"w1w3", GemmPass::forward, 2, 8192, 6400, 1600, true},  {"w1w3", GemmPass::data_grad, 2, 8192, 1600, 6400, true},
      {"w1w3", GemmPass::weight_grad, 2, 6400, 1600, 8192, true}, {"w2", GemmPass::forward, 1, 8192, 1600, 6400, true},
      {"w2", GemmPass::data_grad, 1, 8192, 6400, 1600, true},    {"w2", GemmPass::weight_grad, 1, 1600, 6400, 8192, true},
      {"lm_head", GemmPass::forward, 1, 8192, 10000, 1600, false},
      {"lm_head", GemmPass::data_grad, 1, 8192, 1600, 10000, false},
      {"lm_head", GemmPass::weight_grad, 1, 10000, 1600, 8192, false}};
  for (std::size_t i = 0; i < gemms.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(std::string(gemms[i].layer), want[i].layer);
    EXPECT_EQ(gemms[i].pass, want[i].pass);
    EXPECT_EQ(gemms[i].group, want[i].group);
    EXPECT_EQ(gemms[i].m, want[i].m);
    EXPECT_EQ(gemms[i].n, want[i].n);
    EXPECT_EQ(gemms[i].k, want[i].k);
    EXPECT_EQ(gemms[i].in_block, want[i].in_block);
  }
  EXPECT_EQ(gemm_pass_name(GemmPass::forward), "forward");
  EXPECT_EQ(gemm_pass_name(GemmPass::data_grad), "dx");
  EXPECT_EQ(gemm_pass_name(GemmPass::weight_grad), "dW");
}

TEST(BlockGemms, FlopsMatchTheModelsMatmulCount) {
  // Every layer's block GEMMs plus the head's, over `rows` tokens, are the training step's
  // matmul FLOPs: 6 * matmul parameters * tokens (model_dims.h, the attention products aside).
  const model::ModelDims d = xl();
  const std::int64_t rows = 8192;
  double block = 0, head = 0;
  for (const BlockGemm& g : block_gemms(d, rows)) (g.in_block ? block : head) += g.flops();
  const double model = 6.0 * static_cast<double>(d.matmul_parameter_count()) * static_cast<double>(rows);
  EXPECT_DOUBLE_EQ(block * static_cast<double>(d.layers) + head, model);
  // One block: 3 passes x 2 * rows * (4 d^2 + 3 d F).
  EXPECT_DOUBLE_EQ(block, 3.0 * 2.0 * rows * (4.0 * 1600 * 1600 + 3.0 * 1600 * 6400));
}

TEST(BlockGemms, GroupSpacingIsTheParameterStores) {
  // A group's weights lie g.spacing weights apart in the flat store: q, k, v back to back and w1,
  // w3 back to back (the one-GEMM path). Checked against the element offsets of the model's own
  // layout, so a reordered store fails here.
  const model::ModelDims d = xl();
  const auto layout = model::parameter_layout(d);
  const model::BlockParams b = model::ParamIndex(d).block(3);
  auto at = [&](int i) { return layout[static_cast<std::size_t>(i)]; };
  for (const BlockGemm& g : block_gemms(d, 64)) {
    SCOPED_TRACE(std::string(g.layer));
    if (g.layer == "qkv") {
      for (int i : {b.k, b.v})
        EXPECT_EQ(at(i).offset - at(i - 1).offset, g.spacing * at(b.q).numel);
    } else if (g.layer == "w1w3") {
      EXPECT_EQ(at(b.w3).offset - at(b.w1).offset, g.spacing * at(b.w1).numel);
    } else {
      EXPECT_EQ(g.spacing, 1);
    }
  }
}
