// model::ParamIndex names the positions of model::parameter_layout (docs/architecture.md §2): every
// index it gives must hold the parameter of that name, for any depth.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "lmscale/model/param_layout.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/tensor_parallel.h"

namespace lmscale::model {
namespace {

TEST(ParamIndex, NamesMatchTheLayout) {
  for (int layers : {1, 2, 5}) {
    ModelDims d;
    d.vocab = 11, d.d_model = 8, d.d_ff = 12, d.layers = layers, d.heads = 2;
    const auto layout = parameter_layout(d);
    const ParamIndex ix(layers);
    ASSERT_EQ(static_cast<int>(layout.size()), ix.count());
    auto name = [&](int i) { return layout[static_cast<std::size_t>(i)].name; };
    EXPECT_EQ(name(ix.embedding()), "token_embeddings.weight");
    EXPECT_EQ(name(ix.ln_final()), "ln_final.weight");
    EXPECT_EQ(name(ix.lm_head()), "lm_head.weight");
    for (int l = 0; l < layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      const BlockParams b = ix.block(l);
      EXPECT_EQ(name(b.q), p + "attn.q_proj.weight");
      EXPECT_EQ(name(b.k), p + "attn.k_proj.weight");
      EXPECT_EQ(name(b.v), p + "attn.v_proj.weight");
      EXPECT_EQ(name(b.o), p + "attn.output_proj.weight");
      EXPECT_EQ(name(b.ln1), p + "ln1.weight");
      EXPECT_EQ(name(b.w1), p + "ffn.w1.weight");
      EXPECT_EQ(name(b.w2), p + "ffn.w2.weight");
      EXPECT_EQ(name(b.w3), p + "ffn.w3.weight");
      EXPECT_EQ(name(b.ln2), p + "ln2.weight");
      // w1 and w3 back to back, w2 after them (one GEMM each way for the FFN's a|b), as q, k, v.
      EXPECT_EQ(b.w3, b.w1 + 1);
      EXPECT_EQ(b.w2, b.w3 + 1);
      auto at = [&](int i) { return layout[static_cast<std::size_t>(i)]; };
      EXPECT_EQ(at(b.w3).offset, at(b.w1).offset + at(b.w1).numel);
      EXPECT_EQ(b.all(), (std::array<int, 9>{b.q, b.q + 1, b.q + 2, b.q + 3, b.q + 4, b.q + 5, b.q + 6, b.q + 7, b.q + 8}));
    }
    // Units, and the norms FSDP leaves replicated.
    for (int i = 0; i < ix.count(); ++i) {
      const ParamInfo& info = layout[static_cast<std::size_t>(i)];
      const int unit = info.layer >= 0 ? info.layer + 1 : (info.kind == ParamInfo::Kind::embedding ? 0 : layers + 1);
      EXPECT_EQ(ix.unit_of(i), unit) << info.name;
      EXPECT_EQ(ix.is_norm(i), info.kind == ParamInfo::Kind::norm) << info.name;
      EXPECT_LE(ix.first_of_unit(unit), i) << info.name;
      EXPECT_GT(ix.first_of_unit(unit + 1), i) << info.name;
    }
    EXPECT_EQ(ix.first_of_unit(layers + 2), ix.count());
  }
}

// Mixture of experts (docs/moe.md): every moe_every-th block has the router and the stacked
// experts in place of w1, w3, w2; ParamIndex(dims) finds them by the same names.
TEST(ParamIndex, MoeBlocksMatchTheLayout) {
  for (int every : {1, 2, 3}) {
    ModelDims d;
    d.vocab = 11, d.d_model = 8, d.d_ff = 12, d.layers = 5, d.heads = 2;
    d.moe_experts = 4, d.moe_top_k = 2, d.moe_dff = 6, d.moe_every = every;
    const auto layout = parameter_layout(d);
    const ParamIndex ix(d);
    ASSERT_EQ(static_cast<int>(layout.size()), ix.count()) << every;
    auto name = [&](int i) { return layout[static_cast<std::size_t>(i)].name; };
    auto shape = [&](int i) { return layout[static_cast<std::size_t>(i)].shape; };
    EXPECT_EQ(name(ix.ln_final()), "ln_final.weight");
    EXPECT_EQ(name(ix.lm_head()), "lm_head.weight");
    for (int l = 0; l < 5; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      const BlockParams b = ix.block(l);
      EXPECT_EQ(ix.is_moe(l), d.is_moe_block(l));
      EXPECT_EQ(name(b.q), p + "attn.q_proj.weight");
      EXPECT_EQ(name(b.ln1), p + "ln1.weight");
      EXPECT_EQ(name(b.ln2), p + "ln2.weight");
      if (d.is_moe_block(l)) {
        EXPECT_EQ(name(b.router), p + "ffn.router.weight");
        EXPECT_EQ(name(b.w1), p + "ffn.experts.w1.weight");
        EXPECT_EQ(name(b.w2), p + "ffn.experts.w2.weight");
        EXPECT_EQ(name(b.w3), p + "ffn.experts.w3.weight");
        EXPECT_EQ(shape(b.router), (Shape{4, 8}));
        EXPECT_EQ(shape(b.w1), (Shape{4, 6, 8}));
        EXPECT_EQ(shape(b.w2), (Shape{4, 8, 6}));
        EXPECT_EQ(b.w1, b.router + 1);   // router, w1, w3, w2: the experts' w1 and w3 back to back
        EXPECT_EQ(b.w3, b.w1 + 1);
        EXPECT_EQ(b.w2, b.w3 + 1);
        EXPECT_EQ(b.ln2, b.w2 + 1);
      } else {
        EXPECT_EQ(b.router, -1);
        EXPECT_EQ(name(b.w1), p + "ffn.w1.weight");
      }
    }
    for (int i = 0; i < ix.count(); ++i) {
      const ParamInfo& info = layout[static_cast<std::size_t>(i)];
      const int unit = info.layer >= 0 ? info.layer + 1 : (info.kind == ParamInfo::Kind::embedding ? 0 : 6);
      EXPECT_EQ(ix.unit_of(i), unit) << info.name;
      EXPECT_EQ(ix.is_norm(i), info.kind == ParamInfo::Kind::norm) << info.name;
      EXPECT_LE(ix.first_of_unit(unit), i) << info.name;
      EXPECT_GT(ix.first_of_unit(unit + 1), i) << info.name;
    }
    // Counts: the layout's elements are parameter_count(); the active count swaps E experts for k.
    std::int64_t total = 0;
    for (const auto& p : layout) total += p.numel;
    EXPECT_EQ(total, d.parameter_count());
    EXPECT_EQ(d.parameter_count() - d.active_parameter_count(), d.moe_block_count() * 2 * 3 * 8 * 6);
  }
}

// A tensor-parallel rank's local layout keeps the order, so its w1 and w3 slices (column-parallel:
// [F/tp, d] each) also lie back to back and the FFN's a|b stays one GEMM each way under tp.
TEST(ParamIndex, TensorParallelSlicesOfW1AndW3AreBackToBack) {
  ModelDims d;
  d.vocab = 12, d.d_model = 8, d.d_ff = 12, d.layers = 3, d.heads = 4;
  for (int degree : {2, 4}) {
    for (int rank = 0; rank < degree; ++rank) {
      TensorSplit split;
      split.degree = degree;
      split.rank = rank;
      const auto local = tensor_parallel_layout(d, split);
      const ParamIndex ix(d);
      for (int l = 0; l < 3; ++l) {
        const BlockParams b = ix.block(l);
        const ParamInfo& w1 = local[static_cast<std::size_t>(b.w1)];
        const ParamInfo& w3 = local[static_cast<std::size_t>(b.w3)];
        EXPECT_EQ(w1.shape, (Shape{12 / degree, 8})) << degree;
        EXPECT_EQ(w3.shape, w1.shape);
        EXPECT_EQ(w3.offset, w1.offset + w1.numel) << "tp " << degree << " rank " << rank << " block " << l;
      }
    }
  }
}

}  // namespace
}  // namespace lmscale::model
