// Cost estimates (jobs/predict/cost_estimate.h) against numbers worked by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "lmscale/core/error.h"
#include "lmscale/io/results_attr.h"
#include "lmscale/jobs/predict/cost_estimate.h"
#include "lmscale/model/model_dims.h"

using namespace lmscale;
using namespace lmscale::jobs;

TEST(CostEstimate, ComputeOnlyOnDemand) {
  // 1e21 FLOPs on 100 GPUs of 1e15 FLOP/s at MFU 0.5: 1e21 / 5e16 = 20000 s = 5.5556 h;
  // 555.56 GPU-hours at 2 per GPU-hour = 1111.11.
  CostInputs in;
  in.tokens = 1e11;
  in.flops_per_token = 1e10;
  in.gpus = 100;
  in.peak_flops = 1e15;
  in.mfu = 0.5;
  in.price_per_gpu_hour = 2;
  const CostEstimate e = estimate_cost(in);
  EXPECT_DOUBLE_EQ(e.flops, 1e21);
  EXPECT_NEAR(e.compute_h, 20000.0 / 3600.0, 1e-12);
  EXPECT_EQ(e.checkpoints, 0);
  EXPECT_EQ(e.rework_h, 0);
  EXPECT_NEAR(e.gpu_hours, 2000000.0 / 3600.0, 1e-9);
  EXPECT_NEAR(e.cost, 4000000.0 / 3600.0, 1e-9);
}

TEST(CostEstimate, CheckpointsAndPreemptionsOnSpot) {
  // The worked questions of inputs/text/training_notes.txt, appendix B: 20e9 tokens at
  // 6 x 1e9 + 12 x 30 x 2000 x 2000 = 7.44e9 FLOPs/token; 64 GPUs x 1e15 x 0.4.
  CostInputs in;
  in.tokens = 20e9;
  in.flops_per_token = 6e9 + 12.0 * 30 * 2000 * 2000;
  in.gpus = 64;
  in.peak_flops = 1e15;
  in.mfu = 0.4;
  in.state_bytes = 13.2e9;              // 12 B x 1.1e9 parameters
  in.checkpoint_bytes_per_s = 2e9;      // 6.6 s per checkpoint
  in.checkpoint_interval_h = 0.5;
  in.preemptions_per_gpu_hour = 1.0 / 500;
  in.restart_h = 10.0 / 60;
  in.price_per_gpu_hour = 2;
  in.spot_discount = 0.6;
  const CostEstimate e = estimate_cost(in);
  EXPECT_DOUBLE_EQ(e.flops, 1.488e20);
  const double compute_h = 1.488e20 / 2.56e16 / 3600;   // 5812.5 s = 1.614583 h
  EXPECT_NEAR(e.compute_h, compute_h, 1e-12);
  EXPECT_EQ(e.checkpoints, 4);                         // at 0.5, 1.0, 1.5 h and the end
  EXPECT_NEAR(e.checkpoint_write_s, 6.6, 1e-12);
  EXPECT_NEAR(e.checkpoint_h, 4 * 6.6 / 3600, 1e-12);
  const double preemptions = 64.0 / 500 * (compute_h + 26.4 / 3600);   // 0.207605
  EXPECT_NEAR(e.preemptions, preemptions, 1e-12);
  EXPECT_NEAR(e.lost_per_preemption_h, 0.25 + 1.0 / 6, 1e-12);
  EXPECT_NEAR(e.rework_h, preemptions * (0.25 + 1.0 / 6), 1e-12);
  const double wall = compute_h + 26.4 / 3600 + preemptions * (0.25 + 1.0 / 6);   // 1.708419 h
  EXPECT_NEAR(e.wall_h, wall, 1e-12);
  EXPECT_NEAR(e.gpu_hours, 64 * wall, 1e-9);   // 109.34 GPU-hours
  EXPECT_NEAR(e.price_per_gpu_hour, 0.8, 1e-15);
  EXPECT_NEAR(e.cost, 64 * wall * 0.8, 1e-9);  // 87.47
  EXPECT_NEAR(e.cost, 87.47, 0.01);
}

TEST(CostEstimate, NoCheckpointsLosesHalfTheRunPerPreemption) {
  CostInputs in;
  in.tokens = 1;
  in.flops_per_token = 3.6e18;   // 3600 s = 1 h on one GPU of 1e15 FLOP/s at MFU 1
  in.gpus = 1;
  in.peak_flops = 1e15;
  in.mfu = 1;
  in.preemptions_per_gpu_hour = 0.1;
  const CostEstimate e = estimate_cost(in);
  EXPECT_NEAR(e.compute_h, 1.0, 1e-12);
  EXPECT_NEAR(e.preemptions, 0.1, 1e-12);
  EXPECT_NEAR(e.rework_h, 0.05, 1e-12);
}

TEST(CostEstimate, InputsFromTheDeck) {
  Config c;
  c.model.vocab_size = 1000;
  c.model.context_length = 128;
  c.model.d_model = 64;
  c.model.d_ff = 256;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.cost.tokens = 1e9;
  c.cost.mfu = 0.3;
  c.parallel.dp = 4;
  c.parallel.tp = 2;
  const CostInputs in = cost_inputs(c, 8, 1e15);
  // 6 x (2 x (4 x 64^2 + 3 x 64 x 256) + 1000 x 64) + 12 x 2 x 128 x 64
  const double matmul = 2.0 * (4 * 64 * 64 + 3 * 64 * 256) + 1000.0 * 64;
  EXPECT_DOUBLE_EQ(in.flops_per_token, 6 * matmul + 12.0 * 2 * 128 * 64);
  EXPECT_EQ(in.gpus, 8);
  EXPECT_EQ(in.mfu, 0.3);
  const auto dims = model::ModelDims::from(c.model);
  EXPECT_DOUBLE_EQ(in.state_bytes, 12.0 * static_cast<double>(dims.parameter_count()));
  c.cost.gpus = 16;
  EXPECT_EQ(cost_inputs(c, 8, 1e15).gpus, 16);
  // An MFU from a file that is not there: exit 2 naming the key.
  c.cost.mfu = 0;
  c.cost.mfu_from = "/nonexistent/bench.h5";
  try {
    cost_inputs(c, 8, 1e15);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cost.mfu_from"), std::string::npos);
  }
}
