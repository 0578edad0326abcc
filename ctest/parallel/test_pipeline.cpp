// Pipeline parallelism against one process (docs/architecture.md §4): a 4-layer (6, 8 for interleaved)
// tiny Transformer, fp32 on CPU, several AdamW steps (with clipping), on 2 ranks (pp = 2) and 4
// ranks (pp = 4, dp 2 x pp 2), each schedule (gpipe, 1f1b, interleaved with 2 or 3 chunks), with
// and without activation checkpointing, DDP or ZeRO-1/2 over dp, and a stage-split override. The reference is one process accumulating over the same microbatches
// (train.grad_accum = microbatches per rank): every microbatch's forward and backward are the
// same ops on the same rows, so gradients agree bitwise; the global gradient norm sums squares
// per stage and then over stages (one process: per bucket), a different order, so parameters
// after clipping agree within 1e-6 relative and the losses within 1e-6 relative (measured: 0 with
// dp 1, i.e. bitwise; 4e-8 for parameters and 1e-8 for losses with dp 2, where DDP sums two
// ranks' accumulated gradients in another order than one process). GPipe and 1F1B accumulate
// in the same microbatch order: bitwise equal to each other. ZB-H1 (zb-h1) runs 1F1B with each
// backward split into B and a deferred W (the same weight-gradient products, in microbatch
// order): bitwise equal to both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "lmscale/io/deck.h"
#include "lmscale/comm/factory.h"
#include "lmscale/io/dataset.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/parallel/pipeline.h"
#include "mpi_test_support.h"
#include "parallel_test_util.h"

using namespace lmscale;

namespace {

constexpr double kTolerance = 1e-6;

Config pipe_config() {
  Config c = test::tiny_config();
  c.model.num_layers = 4;
  return c;
}

double max_rel_loss_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return m;
}

struct Case {
  int pp;
  int microbatches;
  const char* ckpt;   // train.activation_checkpointing
  const char* zero;
  const char* stage_layers;
  int virtual_stages = 1;   // > 1: the interleaved schedule alone
  int layers = 4;
  const char* ddp = "none";
};

void check_against_one_process(const Case& c, int steps = 3) {
  const int world = test::mpi_env().size();
  if (world % c.pp != 0) return;
  const int dp = world / c.pp;
  Config cfg = pipe_config();
  cfg.model.num_layers = c.layers;
  io::set_key(cfg, "train.activation_checkpointing", c.ckpt);
  cfg.train.checkpoint_k = 3;   // groups cut by the stage boundaries
  Config ref_cfg = cfg;
  ref_cfg.train.grad_accum = dp * c.microbatches;   // the same microbatch rows as the pipeline
  const test::TrainRun ref = test::train_run(ref_cfg, false, steps);
  test::TrainRun first;
  const std::vector<const char*> schedules =
      c.virtual_stages > 1 ? std::vector<const char*>{"interleaved"} : std::vector<const char*>{"gpipe", "1f1b", "zb-h1"};
  for (const char* schedule : schedules) {
    Config p = cfg;
    p.parallel.virtual_stages = c.virtual_stages;
    p.parallel.pp = c.pp;
    p.parallel.microbatches = c.microbatches;
    io::set_key(p, "parallel.schedule", schedule);
    io::set_key(p, "parallel.zero", c.zero);
    io::set_key(p, "parallel.ddp", c.ddp);
    io::set_key(p, "parallel.stage_layers", c.stage_layers);
    const test::TrainRun got = test::train_run(p, true, steps);
    const std::string what = std::string(schedule) + " pp " + std::to_string(c.pp) + " dp " + std::to_string(dp) +
                             " V " + std::to_string(c.virtual_stages) + " M " + std::to_string(c.microbatches) +
                             " ckpt " + c.ckpt + " zero " + c.zero + " ddp " + c.ddp +
                             " stages '" + c.stage_layers + "'";
    ASSERT_EQ(got.params.size(), ref.params.size()) << what;
    if (test::mpi_env().rank() == 0)
      std::printf("  %s: params %.2e, losses %.2e (relative to one process)\n", what.c_str(),
                  test::max_rel_diff(got.params, ref.params), max_rel_loss_diff(got.losses, ref.losses));
    EXPECT_LT(test::max_rel_diff(got.params, ref.params), kTolerance) << what;
    EXPECT_LT(max_rel_loss_diff(got.losses, ref.losses), kTolerance) << what;
    EXPECT_GT(ref.losses.front() - ref.losses.back(), 0.0) << "the reference does not train: a vacuous comparison";
    if (first.params.empty()) {
      first = got;
    } else {
      EXPECT_EQ(got.params, first.params) << what << ": not bitwise equal to gpipe";
      EXPECT_EQ(got.losses, first.losses) << what;
    }
  }
}

}  // namespace

TEST(Pipeline, TwoStagesMatchOneProcess) {
  check_against_one_process({2, 4, "none", "none", ""});
  check_against_one_process({2, 1, "none", "none", ""});   // M = 1: stage 0 has no steady phase
  check_against_one_process({2, 2, "every-k", "none", "1,3"});
  check_against_one_process({2, 4, "selective", "none", ""});
}

TEST(Pipeline, FourStagesMatchOneProcess) {
  check_against_one_process({4, 8, "none", "none", ""});
  check_against_one_process({4, 2, "none", "none", ""});   // fewer microbatches than stages
}

TEST(Pipeline, DataAndPipelineParallelMatchOneProcess) {
  if (test::mpi_env().size() != 4) GTEST_SKIP() << "dp 2 x pp 2 needs 4 ranks";
  check_against_one_process({2, 2, "none", "none", ""});
  check_against_one_process({2, 4, "none", "zero1", ""});
  check_against_one_process({2, 2, "every-k", "zero2", ""});
  check_against_one_process({2, 4, "none", "none", "", 1, 4, "bucketed"});   // overlapped all-reduces
  check_against_one_process({2, 4, "selective", "none", "", 1, 4, "overlap"});
}

// Interleaved 1F1B (Megatron): V chunks per rank around the ring of stages; microbatches a
// multiple of pp. Each parameter still accumulates its microbatches in order 0..M-1.
TEST(Pipeline, InterleavedMatchesOneProcess) {
  check_against_one_process({2, 2, "none", "none", "", 2});
  check_against_one_process({2, 4, "every-k", "none", "", 2});
  check_against_one_process({2, 4, "selective", "none", "", 3, 6});
  check_against_one_process({4, 4, "none", "none", "", 2, 8});
  check_against_one_process({4, 8, "none", "none", "", 2, 8});
  if (test::mpi_env().size() == 4) {   // dp 2 x pp 2
    check_against_one_process({2, 2, "none", "zero1", "", 2});
    // Strategies that reduce during the last microbatch's backward, which the interleaved
    // schedule splits over the V chunks: armed once per step, not once per chunk.
    check_against_one_process({2, 4, "none", "zero2", "", 2});
    check_against_one_process({2, 4, "none", "none", "", 2, 4, "bucketed"});
    check_against_one_process({2, 2, "none", "none", "", 2, 4, "overlap"});
  }
}

TEST(Pipeline, StagesBalanceLayers) {
  model::ModelDims d;
  d.layers = 10;
  EXPECT_EQ(model::stage_layer_counts(d, 4), (std::vector<int>{2, 2, 3, 3}));
  const auto counts = model::stage_layer_counts(d, 3, {2, 5, 3});
  const auto s1 = model::stage_units(d, counts, 1);
  EXPECT_EQ(s1.first, 3);   // blocks 2..6 are units 3..7
  EXPECT_EQ(s1.end, 8);
  EXPECT_FALSE(s1.owns_embedding());
  EXPECT_FALSE(s1.owns_head(d));
  EXPECT_EQ(s1.first_param(d), 1 + 9 * 2);
  EXPECT_EQ(s1.end_param(d), 1 + 9 * 7);
  EXPECT_TRUE(model::stage_units(d, counts, 2).owns_head(d));
  EXPECT_NEAR(parallel::theory_bubble_fraction(2, 8), 1.0 / 9.0, 1e-15);
  // Interleaved chunks: rank 1 of 2 with 2 chunks of an 8-layer model holds blocks 2-3 and 6-7
  // (and the head).
  d.layers = 8;
  const auto chunks = model::pipeline_chunks(d, 2, 2, 1);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].first, 3);
  EXPECT_EQ(chunks[0].end, 5);
  EXPECT_EQ(chunks[1].first, 7);
  EXPECT_TRUE(chunks[1].owns_head(d));
}

// ZB-H1's order on each stage s of p (parallel/pipeline.h): every microbatch's W after its B, W
// in microbatch order, W(i) right after the steady backward of microbatch i + s (stage 0: after
// its own B; the last stage defers p - 1), and at most p microbatches between their forward and
// their W (the first stage's 1F1B bound). A schedule that ran W inside B (1f1b) fails the
// deferral check on every stage but the first.
TEST(Pipeline, ZeroBubbleDefersWeightPasses) {
  const int p = test::mpi_env().size(), M = 6;
  Config cfg = pipe_config();
  cfg.parallel.pp = p;
  cfg.parallel.microbatches = M;
  io::set_key(cfg, "parallel.schedule", "zb-h1");
  test::CpuJobEnv job(cfg, true);
  const std::int64_t T = cfg.model.context_length;
  jobs::Trainer trainer(job.env, 8, 1, 1);
  io::SyntheticTokens data(cfg.model.vocab_size, cfg.run.seed);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(trainer.local_rows() * (T + 1)));
  data.sample(0, trainer.first_row(), trainer.local_rows(), T, tok.data(), false);
  trainer.train_step(tok, T);
  parallel::PipelineParallel& pipe = *trainer.pipeline();
  pipe.finish_timing();
  const int s = pipe.stage();
  std::vector<char> kind;   // 'F', 'B', 'W' in the stage's order
  std::vector<int> micro, weights_seen;
  int in_flight = 0, peak = 0;
  for (const auto& e : pipe.events()) {
    kind.push_back(e.weight ? 'W' : e.backward ? 'B' : 'F');
    micro.push_back(e.micro);
    in_flight += kind.back() == 'F' ? 1 : kind.back() == 'W' ? -1 : 0;
    peak = std::max(peak, in_flight);
    if (e.weight) weights_seen.push_back(e.micro);
  }
  ASSERT_EQ(weights_seen, (std::vector<int>{0, 1, 2, 3, 4, 5})) << "stage " << s << ": one W per microbatch, in order";
  EXPECT_EQ(in_flight, 0);
  EXPECT_EQ(peak, std::min(p, M)) << "stage " << s;
  auto position = [&](char k, int m) {
    for (std::size_t i = 0; i < kind.size(); ++i)
      if (kind[i] == k && micro[i] == m) return static_cast<int>(i);
    return -1;
  };
  for (int m = 0; m < M; ++m) {
    EXPECT_LT(position('F', m), position('B', m)) << "stage " << s << " micro " << m;
    EXPECT_LT(position('B', m), position('W', m)) << "stage " << s << " micro " << m;
  }
  // The steady phase: W(i) follows B(i + s) directly (M - (p - s - 1) steady backwards).
  const int steady = M - std::min(p - s - 1, M);
  for (int i = 0; i + s < steady; ++i)
    EXPECT_EQ(position('W', i), position('B', i + s) + 1) << "stage " << s << " micro " << i;
  if (s > 0) EXPECT_GT(position('W', 0), position('B', s)) << "stage " << s << ": W not deferred";
}

TEST(Pipeline, ZeroBubbleFraction) {
  // Without W (w = 0) the zb-h1 bubble is 1f1b's (p-1)/(M+p-1).
  EXPECT_NEAR(parallel::zero_bubble_fraction(4, 8, 1, 2, 0), parallel::theory_bubble_fraction(4, 8), 1e-15);
  // M >= p, equal passes: idle (p-1)(f+b-w) = p-1 of 3M + p-1 (a third of 1f1b's idle time).
  EXPECT_NEAR(parallel::zero_bubble_fraction(2, 8, 1, 1, 1), 1.0 / 25.0, 1e-15);
  EXPECT_NEAR(parallel::zero_bubble_fraction(4, 8, 1, 1.2, 0.8), 3 * 1.4 / (3 * 1.4 + 8 * 3.0), 1e-15);
  // M < p: only M - 1 W passes fill the cool-down: idle (p-1)(f+b) - (M-1) w = 6 - 1.
  EXPECT_NEAR(parallel::zero_bubble_fraction(4, 2, 1, 1, 1), 5.0 / 11.0, 1e-15);
}
