// Accounting (jobs/accounting.h) against hand-counted numbers: parameter bytes, sharded optimizer
// state, activations of the xl model at batch 4 x 512 in bf16 (the device measured a 34.624 GiB
// peak for this deck on an H100, gradients per bucket; the prediction must be within 2%), and
// communication volumes.
#include <gtest/gtest.h>

#include "lmscale/jobs/accounting.h"

using namespace lmscale;

namespace {
Config xl_bf16() {
  Config c;
  c.run.job = "bench-model";
  c.model.size = "xl";
  c.model.vocab_size = 10000;
  c.model.d_model = 1600;
  c.model.d_ff = 6400;
  c.model.num_layers = 48;
  c.model.num_heads = 25;
  c.model.context_length = 512;
  c.precision.mode = "bf16";
  c.bench.batch_size = 4;
  return c;
}
double item(const jobs::Accounting& a, const std::string& n) {
  for (const auto& i : a.memory)
    if (i.name == n) return i.bytes;
  return -1;
}
}  // namespace

TEST(Accounting, XlBf16OneGpuMatchesTheMeasuredPeak) {
  const auto a = jobs::account(xl_bf16(), 1, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(a.parameters, 1998235200);
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4.0 * 1998235200);
  EXPECT_DOUBLE_EQ(item(a, "parameters_lowp"), 2.0 * 1998235200);
  EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8.0 * 1998235200);
  // per layer: (8*1600 + 3*6400) * 2048 * 2 B + 2*2048*4 + 4*25*512*512*2
  EXPECT_DOUBLE_EQ(item(a, "activations"), 48.0 * ((8 * 1600 + 3 * 6400) * 2048.0 * 2 + 2 * 2048 * 4 + 4 * 25 * 512.0 * 512 * 2));
  EXPECT_DOUBLE_EQ(item(a, "gradients"), 0.0);   // allocated during the backward, per bucket
  const double measured = 34.624 * (1u << 30);
  EXPECT_NEAR(a.peak_bytes, measured, 0.02 * measured);
  EXPECT_EQ(a.comm_bytes_per_step, 0.0);
  EXPECT_NEAR(a.flops_per_step, 6.0 * (48.0 * (4 * 1600 * 1600 + 3 * 1600 * 6400) + 10000.0 * 1600) * 2048 +
                                    12.0 * 48 * 512 * 1600 * 2048, 1.0);
}

TEST(Accounting, Zero1ShardsOptimizerStateAndKeepsCommunicationVolume) {
  Config c = xl_bf16();
  c.bench.batch_size = 8;
  c.parallel.ddp = "bucketed";
  const auto ddp = jobs::account(c, 2, "");
  c.parallel.zero = "zero1";
  const auto z = jobs::account(c, 2, "");
  EXPECT_DOUBLE_EQ(item(z, "optimizer_state"), item(ddp, "optimizer_state") / 2);
  EXPECT_DOUBLE_EQ(ddp.comm_bytes_per_step, 2 * 0.5 * 4 * 1998235200.0);
  EXPECT_DOUBLE_EQ(z.comm_bytes_per_step, ddp.comm_bytes_per_step);
  EXPECT_EQ(ddp.local_batch, 4);
}

// Pipeline (pp = 2, 8 microbatches of one sequence, global batch 8): stage 0 holds the embedding
// and 24 blocks, stage 1 24 blocks, the final norm and the head; 1F1B keeps at most p - s microbatches in flight, GPipe all M; between stages each
// microbatch moves [512, 1600] bf16 once each way.
TEST(Accounting, PipelineStagesAndMicrobatchesInFlight) {
  Config c = xl_bf16();
  c.bench.batch_size = 8;
  c.model.attention = "flash";
  c.parallel.pp = 2;
  c.parallel.microbatches = 8;
  c.parallel.schedule = "1f1b";
  const auto a = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");
  const double block_params = 4.0 * 1600 * 1600 + 3.0 * 1600 * 6400 + 2 * 1600;
  const double stage0 = 10000.0 * 1600 + 24 * block_params;   // the larger stage in activations
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * stage0);
  const double n = 512, per_block = (8 * 1600 + 3 * 6400) * n * 2 + 2 * n * 4 + 25 * 512 * 4;
  EXPECT_DOUBLE_EQ(item(a, "activations"), 2 * 24 * per_block);   // stage 0: 2 microbatches in flight
  EXPECT_DOUBLE_EQ(a.comm_bytes_per_step, 8 * n * 1600 * 2);   // stage 0 sends activations only
  c.parallel.schedule = "gpipe";
  const auto g = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");
  EXPECT_GT(item(g, "activations"), 3 * item(a, "activations"));   // all 8 in flight
}
