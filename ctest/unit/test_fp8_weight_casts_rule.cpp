// precision.fp8_weight_casts (docs/precision.md, "Weights cast by the optimizer step"): the deck
// key (default optimizer, its two values) and the one rule that says where the optimizer step
// casts the FP8 weights, parallel::step_casts_fp8_weights, which the Trainer and the memory
// replay both ask: true for the layouts whose step updates the whole store in one pass, false as
// soon as any of its conditions fails (each checked alone from a configuration where it holds).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lmscale/io/deck.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/parallel/strategy.h"

namespace lmscale::test {
namespace {

Config fp8_delayed() {
  Config c = io::parse_deck_text("[model]\nsize = small\n[precision]\nmode = fp8\nfp8_scaling = delayed\n", {}, 1);
  c.model.d_model = 768;   // the small preset's widths, multiples of 64
  c.model.d_ff = 3072;
  return c;
}

// world ranks, all of them data-parallel.
bool rule(Config c, int world = 1, std::int64_t accum = 1, Device d = Device::cuda) {
  c.parallel.dp = world;
  return parallel::step_casts_fp8_weights(c, parallel::Spec::resolve(c.parallel, world), accum, d);
}

TEST(Fp8WeightCastsRule, TheDeckKeyDefaultsToTheOptimizer) {
  EXPECT_EQ(Config{}.precision.fp8_weight_casts, Fp8WeightCastSite::optimizer);
  const Config c = io::parse_deck_text("[precision]\nmode = fp8\nfp8_weight_casts = forward\n", {}, 1);
  EXPECT_EQ(c.precision.fp8_weight_casts, Fp8WeightCastSite::forward);
}

TEST(Fp8WeightCastsRule, OneProcessAndDdpCastInTheStep) {
  const Config c = fp8_delayed();
  EXPECT_TRUE(rule(c));
  EXPECT_TRUE(rule(c, 2)) << "DDP on two ranks";
  Config b = c;
  b.run.job = JobKind::bench_model;
  b.bench.mode = BenchMode::train_step;
  EXPECT_TRUE(rule(b)) << "bench-model train-step";
}

TEST(Fp8WeightCastsRule, EachConditionTurnsItOff) {
  const std::vector<std::pair<std::string, std::function<bool()>>> off = {
      {"current scaling", [] { Config c = fp8_delayed(); c.precision.fp8_scaling = Fp8Scaling::current; return rule(c); }},
      {"bf16", [] { Config c = fp8_delayed(); c.precision.mode = PrecisionMode::bf16; return rule(c); }},
      {"fp8_weight_casts = forward",
       [] { Config c = fp8_delayed(); c.precision.fp8_weight_casts = Fp8WeightCastSite::forward; return rule(c); }},
      {"the CPU", [] { return rule(fp8_delayed(), 1, 1, Device::cpu); }},
      {"grad_accum 2", [] { return rule(fp8_delayed(), 1, 2); }},
      {"zero2 on two ranks", [] { Config c = fp8_delayed(); c.parallel.zero = ZeroLevel::zero2; return rule(c, 2); }},
      {"fsdp on two ranks", [] { Config c = fp8_delayed(); c.parallel.zero = ZeroLevel::fsdp; return rule(c, 2); }},
      {"offload", [] { Config c = fp8_delayed(); c.parallel.offload = OffloadMode::optimizer; return rule(c); }},
      {"overlap_optimizer", [] { Config c = fp8_delayed(); c.parallel.overlap_optimizer = true; return rule(c); }},
      {"sgd", [] { Config c = fp8_delayed(); c.optim.name = OptimizerName::sgd; return rule(c); }},
      {"d_model 784", [] { Config c = fp8_delayed(); c.model.d_model = 784; return rule(c); }},
      {"d_ff 3056", [] { Config c = fp8_delayed(); c.model.d_ff = 3056; return rule(c); }},
      {"bench-model forward", [] {
         Config c = fp8_delayed();
         c.run.job = JobKind::bench_model;
         c.bench.mode = BenchMode::forward;
         return rule(c);
       }},
      {"bench-model forward-backward", [] {
         Config c = fp8_delayed();
         c.run.job = JobKind::bench_model;
         c.bench.mode = BenchMode::forward_backward;
         return rule(c);
       }},
  };
  for (const auto& [what, on] : off) EXPECT_FALSE(on()) << what << ": the step still casts the weights";
}

}  // namespace
}  // namespace lmscale::test
