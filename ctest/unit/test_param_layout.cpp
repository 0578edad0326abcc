// model::ParamIndex names the positions of model::parameter_layout (docs/architecture.md §2): every
// index it gives must hold the parameter of that name, for any depth.
#include <gtest/gtest.h>

#include <string>

#include "lmscale/model/param_layout.h"
#include "lmscale/model/parameter_store.h"

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

}  // namespace
}  // namespace lmscale::model
