// FSDP composed with pipeline parallelism (docs/architecture.md §4): dp 2 x pp 2 on 4 CPU ranks,
// each stage's units sharded over its dp pair (gathered ahead of each microbatch's forward and
// backward, gradients reduce-scattered per microbatch), against one process accumulating over the
// same microbatch rows (train.grad_accum = dp x microbatches). A tiny Transformer (4 layers), fp32,
// 3 AdamW steps with clipping active, gpipe and 1f1b, with and without activation checkpointing,
// with fsdp's prefetch off and on. Tolerance 1e-6 relative for losses, gradient norms and final
// weights (the reduce-scatter and the per-stage norm sums add in another order than one process).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "lmscale/io/deck.h"
#include "lmscale/jobs/engine/trainer.h"
#include "parallel_test_util.h"

using namespace lmscale;

namespace {

constexpr double kTol = 1e-6;

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

struct Case {
  const char* schedule;
  int microbatches;
  const char* recompute;
  int prefetch;
};

}  // namespace

TEST(FsdpPipeline, MatchesOneProcess) {
  if (test::mpi_env().size() != 4) GTEST_SKIP() << "dp 2 x pp 2 on 4 ranks";
  const std::vector<Case> cases = {
      {"gpipe", 2, "none", 1}, {"1f1b", 4, "none", 1}, {"1f1b", 2, "every-k", 0}, {"gpipe", 4, "selective", 2}};
  for (const Case& c : cases) {
    Config cfg = test::tiny_config();
    cfg.model.num_layers = 4;
    io::set_key(cfg, "train.activation_checkpointing", c.recompute);
    Config ref_cfg = cfg;
    ref_cfg.train.grad_accum = 2 * c.microbatches;   // dp 2 x the pipeline's microbatches, in row order
    const test::TrainRun ref = test::train_run(ref_cfg, false, 3);
    ASSERT_GT(ref.losses.front() - ref.losses.back(), 0.0) << "the reference does not train: a vacuous comparison";
    Config p = cfg;
    p.parallel.pp = 2;
    p.parallel.microbatches = c.microbatches;
    io::set_key(p, "parallel.schedule", c.schedule);
    io::set_key(p, "parallel.zero", "fsdp");
    p.parallel.fsdp_prefetch = c.prefetch;
    const test::TrainRun got = test::train_run(p, true, 3);
    const std::string what = std::string("fsdp dp 2 x pp 2 ") + c.schedule + " M " + std::to_string(c.microbatches) +
                             " " + c.recompute + " prefetch " + std::to_string(c.prefetch);
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
    double wl = 0, wn = 0;
    for (std::size_t s = 0; s < ref.losses.size(); ++s) {
      wl = std::max(wl, rel(got.losses[s], ref.losses[s]));
      wn = std::max(wn, rel(got.norms[s], ref.norms[s]));
    }
    ASSERT_EQ(got.params.size(), ref.params.size()) << what;
    const double wp = test::max_rel_diff(got.params, ref.params);
    EXPECT_LT(wl, kTol) << what;
    EXPECT_LT(wn, kTol) << what;
    EXPECT_LT(wp, kTol) << what;
    if (test::mpi_env().rank() == 0)
      std::printf("  %-48s max rel diff: loss %.2e  grad norm %.2e  weights %.2e\n", what.c_str(), wl, wn, wp);
  }
}
