// Activation checkpointing (model/recompute.h) on CPU in fp32: every policy gives bitwise the
// gradients and loss of `none` (the recompute runs the same ops on the same inputs), keeps fewer
// bytes between the forward and the backward (every-k 1 < selective < none), and calls the
// per-unit hooks in the documented order (model/parallel_context.h).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/transformer.h"

using namespace lmscale;

namespace {

model::ModelDims dims(bool flash) {
  model::ModelDims d;
  d.vocab = 13;
  d.context = 7;
  d.d_model = 16;
  d.d_ff = 24;
  d.layers = 5;   // groups of 2 and 3 leave a partial last group
  d.heads = 2;
  d.flash = flash;
  return d;
}

struct Pass {
  std::vector<float> grads;
  float loss = 0;
  std::size_t kept_bytes = 0;   // allocated between the end of the forward and the backward
  std::vector<std::string> hooks;
};

Pass run(bool flash, model::RecomputePolicy policy) {
  HostAllocator alloc;
  Context ctx;
  ctx.allocator = &alloc;
  ctx.host = &alloc;
  const model::ModelDims d = dims(flash);
  model::ParameterStore ps(d, DType::f32, DType::f32, alloc);
  ps.init(5, ctx);
  model::TransformerLM m(d, ps);
  m.set_recompute(policy);
  const std::int64_t B = 3, T = 7;
  Tensor x = Tensor::empty({B, T}, DType::i32, alloc), y = Tensor::empty({B, T}, DType::i32, alloc);
  std::mt19937 g(17);
  for (std::int64_t i = 0; i < B * T; ++i) {
    x.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(g() % d.vocab);
    y.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(g() % d.vocab);
  }
  Pass r;
  model::ParallelContext pc;
  auto log = [&](const char* what) { return [&r, what](int u) { r.hooks.push_back(what + std::to_string(u)); }; };
  pc.before_forward = log("F");
  pc.after_forward = log("f");
  pc.before_backward = log("B");
  pc.after_backward = log("b");
  const std::size_t before = alloc.tracker().current();
  auto act = m.forward(ctx, x, y, true, 1.0 / static_cast<double>(B * T), pc, false);
  r.kept_bytes = alloc.tracker().current() - before;
  r.loss = act->loss_sum.data_as<float>()[0];
  m.backward(ctx, *act, pc, false);
  r.grads.assign(ps.flat_grads().data_as<float>(), ps.flat_grads().data_as<float>() + ps.numel());
  return r;
}

model::RecomputePolicy every(int k, bool keep_attention = false, int layers = 0) {
  return model::RecomputePolicy::from(Checkpointing::every_k, k, keep_attention, layers);
}

}  // namespace

class Recompute : public ::testing::TestWithParam<bool> {};

TEST_P(Recompute, EveryPolicyGivesBitwiseTheGradientsOfNone) {
  const bool flash = GetParam();
  const Pass ref = run(flash, {});
  for (auto [name, policy] : {std::pair{"every-1", every(1)}, std::pair{"every-2", every(2)},
                              std::pair{"every-3", every(3)}, std::pair{"every-5", every(5)},
                              std::pair{"every-1 keep attention", every(1, true)},
                              std::pair{"every-2 keep attention", every(2, true)},
                              std::pair{"every-2 first 3 blocks", every(2, false, 3)},
                              std::pair{"every-1 first 2 blocks, keep attention", every(1, true, 2)},
                              std::pair{"selective", model::RecomputePolicy::from(Checkpointing::selective, 1)},
                              std::pair{"selective-mlp", model::RecomputePolicy::from(Checkpointing::selective_mlp, 1)}}) {
    const Pass got = run(flash, policy);
    EXPECT_EQ(got.loss, ref.loss) << name;
    ASSERT_EQ(got.grads.size(), ref.grads.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < ref.grads.size(); ++i) differ += got.grads[i] != ref.grads[i];
    EXPECT_EQ(differ, 0u) << name << ": gradients differ from none's";
    EXPECT_LT(got.kept_bytes, ref.kept_bytes) << name << " keeps no less than none";
  }
}

TEST_P(Recompute, FullCheckpointingKeepsLeastThenSelectiveMlpThenSelective) {
  const bool flash = GetParam();
  const std::size_t none = run(flash, {}).kept_bytes;
  const std::size_t sel = run(flash, model::RecomputePolicy::from(Checkpointing::selective, 1)).kept_bytes;
  const std::size_t mlp = run(flash, model::RecomputePolicy::from(Checkpointing::selective_mlp, 1)).kept_bytes;
  const std::size_t every1 = run(flash, every(1)).kept_bytes;
  const std::size_t every5 = run(flash, every(5)).kept_bytes;
  EXPECT_LT(every1, mlp);
  EXPECT_LT(mlp, sel);
  EXPECT_LT(sel, none);
  EXPECT_LE(every5, every1);   // one group: a single [N,d] input kept
}

TEST_P(Recompute, KeepAttentionKeepsEachBlocksAttentionOutputAndAuxBesideTheGroupInputs) {
  // keep_attention adds, per block, o [B T, d] and the aux: flash's log-sum-exp [B,H,T] or naive
  // attention's probabilities [B,H,T,T] (fp32 here, as everything on this CPU run).
  const bool flash = GetParam();
  const model::ModelDims d = dims(flash);
  const std::size_t B = 3, T = 7, H = static_cast<std::size_t>(d.heads), D = static_cast<std::size_t>(d.d_model);
  const std::size_t per_block = 4 * (B * T * D + (flash ? B * H * T : B * H * T * T));
  for (int k : {1, 2}) {
    const std::size_t plain = run(flash, every(k)).kept_bytes, kept = run(flash, every(k, true)).kept_bytes;
    EXPECT_EQ(kept, plain + static_cast<std::size_t>(d.layers) * per_block) << "k = " << k;
  }
  EXPECT_THROW(model::RecomputePolicy::from(Checkpointing::selective, 1, true), Error);
}

TEST_P(Recompute, CheckpointLayersKeepsEverythingPastTheFirstN) {
  // checkpoint_layers = n: blocks n.. keep what none keeps, so the kept bytes rise with n's
  // complement: every-1 (all) < first 3 < first 1 < none, and first 5 of 5 is every-1 itself.
  const bool flash = GetParam();
  const std::size_t none = run(flash, {}).kept_bytes, all = run(flash, every(1)).kept_bytes;
  const std::size_t first3 = run(flash, every(1, false, 3)).kept_bytes, first1 = run(flash, every(1, false, 1)).kept_bytes;
  EXPECT_LT(all, first3);
  EXPECT_LT(first3, first1);
  EXPECT_LT(first1, none);
  EXPECT_EQ(run(flash, every(1, false, 5)).kept_bytes, all);
  // The blocks past the checkpointed ones run their backwards first and alone, as under none;
  // then the groups of 2 within the first 3 blocks: {3}, {1,2} (units 1..5 are blocks 0..4).
  const std::vector<std::string> expect = {"F0", "f0", "F1", "f1", "F2", "f2", "F3", "f3", "F4", "f4", "F5", "f5",
                                           "F6", "B6", "b6", "f6", "B5", "b5", "B4", "b4", "B3", "b3", "B2", "B1",
                                           "b2", "b1", "B0", "b0"};
  EXPECT_EQ(run(flash, every(2, false, 3)).hooks, expect);
  EXPECT_THROW(model::RecomputePolicy::from(Checkpointing::selective, 1, false, 2), Error);
}

TEST_P(Recompute, HooksCallEachUnitInOrderAndGroupsBeforeTheirRecompute) {
  const Pass r = run(GetParam(), every(2));
  // 5 blocks: units 0 (embedding), 1..5, 6 (head). Groups of 2 from the first block: {1,2},
  // {3,4}, {5}; the backward visits them last first, announcing a group's units before its
  // recompute. The head unit's backward runs inside the forward (fused LM head + cross-entropy):
  // its backward hooks come between its forward hooks.
  const std::vector<std::string> expect = {"F0", "f0", "F1", "f1", "F2", "f2", "F3", "f3", "F4", "f4", "F5", "f5",
                                           "F6", "B6", "b6", "f6", "B5", "b5", "B4", "B3", "b4", "b3", "B2", "B1",
                                           "b2", "b1", "B0", "b0"};
  EXPECT_EQ(r.hooks, expect);
}

INSTANTIATE_TEST_SUITE_P(Attention, Recompute, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "flash" : "naive"; });
