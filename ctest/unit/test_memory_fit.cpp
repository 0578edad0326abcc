// The memory check before a run (jobs/predict/memory_fit.h): the peak of the predicted phases per mode, and the
// refusal (exit 2) when it exceeds the memory available, with both numbers and the keys to change.
#include <gtest/gtest.h>

#include <string>

#include "lmscale/io/deck.h"
#include "lmscale/core/error.h"
#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/jobs/predict/memory_fit.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/ops/runtime.h"

using namespace lmscale;

namespace {

Config xl_bench(const std::string& mode) {
  Config c;
  c.run.job = JobKind::bench_model;
  io::set_key(c, "bench.mode", mode);
  c.model.d_model = 1600;
  c.model.d_ff = 6400;
  c.model.num_layers = 48;
  c.model.num_heads = 25;
  c.model.context_length = 512;
  c.precision.mode = PrecisionMode::bf16;
  c.bench.batch_size = 4;
  return c;
}

constexpr double GiB = 1024.0 * 1024 * 1024;

}  // namespace

TEST(MemoryFit, NeedIsThePeakOfThePhasesTheModeRuns) {
  const Config step = xl_bench("train-step");
  const auto phases = jobs::predict_memory_phases(step, 1, false);
  const auto need = jobs::predicted_need(step, 1, "");
  ASSERT_TRUE(need);
  EXPECT_DOUBLE_EQ(need->bytes, phases.peak);
  ASSERT_EQ(phases.phases.size(), 3u);
  EXPECT_EQ(need->detail.rfind("peak of phases: init ", 0), 0u) << need->detail;
  EXPECT_NE(need->detail.find("optimizer"), std::string::npos) << need->detail;
  // The optimizer phase holds every gradient bucket beside parameters, bf16 copy, m and v:
  // 4 + 2 + 4 + 8 bytes per parameter of the 2.0e9.
  EXPECT_GT(phases.phases[2].bytes, 18.0 * 1998235200);
  // On an H100 this deck measured a 34.624 GiB peak (the start of the backward's gradients);
  // with the caching allocator's rounding the prediction must be within 2%.
  const double measured = 34.624 * GiB;
  EXPECT_NEAR(jobs::predict_memory_phases(step, 1, true).peak, measured, 0.02 * measured);

  // AdamW's state is allocated when the trainer is built, so a forward-only run holds it too,
  // but no gradients: less than a train step, more than init.
  const auto forward = jobs::predicted_need(xl_bench("forward"), 1, "");
  ASSERT_TRUE(forward);
  EXPECT_LT(forward->bytes, need->bytes);
  EXPECT_GT(forward->bytes, phases.phases[0].bytes);
  EXPECT_EQ(forward->detail.find("optimizer"), std::string::npos) << forward->detail;
  const auto fb = jobs::predicted_need(xl_bench("forward-backward"), 1, "");
  ASSERT_TRUE(fb);
  EXPECT_DOUBLE_EQ(fb->bytes, phases.phases[1].bytes);

  Config accounting = step;
  accounting.run.job = JobKind::accounting;   // computes, allocates nothing
  EXPECT_FALSE(jobs::predicted_need(accounting, 1, ""));
}

TEST(MemoryFit, RefusedWithPredictionAvailableMemoryAndKeys) {
  const Config c = xl_bench("train-step");
  const auto need = jobs::predicted_need(c, 1, "");
  ASSERT_TRUE(need);
  ASSERT_GT(need->bytes, 30 * GiB);   // about 34.6 GiB
  const jobs::MemoryBudget h100{79.1 * GiB, "are free on GPU 0"};
  EXPECT_FALSE(jobs::memory_fit_problem(*need, 1, h100, c));

  const jobs::MemoryBudget small{24 * GiB, "are free on GPU 0"};
  const auto problem = jobs::memory_fit_problem(*need, 1, small, c);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find(jobs::format_bytes(need->bytes) + " per rank"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("only 24.00 GiB are free on GPU 0"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("bench.batch_size"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("model.context_length"), std::string::npos) << *problem;
  EXPECT_EQ(problem->find('\n'), std::string::npos) << "one line";

  // Host memory is shared by the ranks of a node: two ranks of 34.6 GiB do not fit in 64 GiB.
  const jobs::MemoryBudget host{64 * GiB, "are available in host memory"};
  EXPECT_FALSE(jobs::memory_fit_problem(*need, 1, host, c));
  const auto shared = jobs::memory_fit_problem(*need, 2, host, c);
  ASSERT_TRUE(shared);
  EXPECT_NE(shared->find("for the 2 ranks sharing it"), std::string::npos) << *shared;
}

TEST(MemoryFit, ThisMachineRefusesAnImpossibleContextButRunsATinyModel) {
  ops::Runtime rt(Device::cpu, 0, false);
  const jobs::MemoryBudget b = jobs::memory_budget(rt);
  EXPECT_GT(b.bytes, 0.0);
  Config c;
  c.run.job = JobKind::train;
  c.parallel.device = DeviceChoice::cpu;
  c.model.vocab_size = 512;
  c.model.d_model = 128;
  c.model.d_ff = 344;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.context_length = 64;
  EXPECT_NO_THROW(jobs::check_memory_fits(c, 1, 1, rt));
  c.model.context_length = 99999999999;
  try {
    jobs::check_memory_fits(c, 1, 1, rt);
    FAIL() << "an impossible run passed the memory check";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit in memory"), std::string::npos) << e.what();
  }
}

TEST(MemoryFit, FormatBytes) {
  EXPECT_EQ(jobs::format_bytes(512), "512 B");
  EXPECT_EQ(jobs::format_bytes(1.5 * GiB), "1.50 GiB");
  EXPECT_EQ(jobs::format_bytes(3.0 * 1024 * GiB), "3.00 TiB");
}

// parallel.comm_sms on a CPU runtime: 0 is accepted and carves nothing; anything else is a usage
// error naming the key (the deck check refuses device = cpu first; this is the runtime's guard).
TEST(RuntimeCommSms, CpuTakesOnlyZero) {
  ops::Runtime rt(Device::cpu, 0, false);
  EXPECT_NO_THROW(rt.set_comm_sms(0));
  {
    ops::Runtime::GemmCarveout carve(rt, true);
    EXPECT_EQ(rt.gemm_sm_target(), 0);
  }
  try {
    rt.set_comm_sms(8);
    FAIL() << "comm_sms = 8 on the CPU was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.comm_sms"), std::string::npos) << e.what();
  }
  EXPECT_THROW(rt.set_comm_sms(-1), UsageError);
  EXPECT_EQ(rt.comm_sms(), 0);
}

// The arithmetic floor (issue 36: model.num_layers = 100000000 allocated 24 GB in the detailed
// prediction before it was refused): parameters x fp32 bytes over all ranks, never above the
// detailed prediction, and refused with the shape keys named.
TEST(MemoryFit, ParameterFloorIsArithmeticAndBelowThePrediction) {
  Config step = xl_bench("train-step");
  const auto floor = jobs::parameter_floor(step, 1);
  ASSERT_TRUE(floor);
  EXPECT_DOUBLE_EQ(floor->bytes, 4.0 * 1998235200);   // bench: fp32 weights
  EXPECT_LE(floor->bytes, jobs::predicted_need(step, 1, "")->bytes);
  EXPECT_DOUBLE_EQ(jobs::parameter_floor(step, 4)->bytes, floor->bytes / 4);

  Config train;
  train.run.job = JobKind::train;
  train.model.num_layers = 100000000;
  train.model.d_model = 16;
  train.model.d_ff = 32;
  train.model.vocab_size = 64;
  const auto huge = jobs::parameter_floor(train, 1);   // returns at once: nothing per layer
  ASSERT_TRUE(huge);
  EXPECT_DOUBLE_EQ(huge->bytes, 8.0 * (2 * 64 * 16 + 1e8 * (4 * 256 + 3 * 16 * 32 + 32) + 16));
  const auto problem = jobs::parameter_floor_problem(*huge, 2, {64 * GiB, "are available"}, train, 1);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("model.num_layers = 100000000"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("for the 2 ranks sharing it"), std::string::npos) << *problem;
  EXPECT_NE(problem->find("64.00 GiB are available"), std::string::npos) << *problem;
  EXPECT_FALSE(jobs::parameter_floor_problem(*floor, 1, {64 * GiB, ""}, step, 1));

  Config accounting = train;
  accounting.run.job = JobKind::accounting;
  EXPECT_FALSE(jobs::parameter_floor(accounting, 1));
}

// MoE decks are predicted (jobs/predict/memory_replay_moe.cpp) and so fit-checked like dense
// ones: the need is the replay's peak, and it grows with the experts this rank holds (ep splits
// them) and with the rows they compute (top-k).
TEST(MemoryFit, MixtureOfExpertsIsPredictedAndChecked) {
  Config c = xl_bench("train-step");
  c.model.num_layers = 4;
  c.model.moe_experts = 8;
  c.model.moe_top_k = 2;
  c.model.moe_expert_dff = 1024;
  const auto need = jobs::predicted_need(c, 1, "");
  ASSERT_TRUE(need);
  EXPECT_DOUBLE_EQ(need->bytes, jobs::predict_memory_phases(c, 1, false).peak);
  Config dense = c;
  dense.model.moe_experts = 0;
  EXPECT_GT(need->bytes, jobs::predicted_need(dense, 1, "")->bytes);   // 8 experts of 3 d Fe each
  Config ep = c;
  ep.parallel.ep = 2;
  ep.parallel.dp = 2;
  ep.bench.batch_size = 2 * c.bench.batch_size;   // the same rows per rank
  EXPECT_LT(jobs::predicted_need(ep, 2, "")->bytes, need->bytes);   // half the experts per rank
  Config top1 = c;
  top1.model.moe_top_k = 1;
  EXPECT_LT(jobs::predicted_need(top1, 1, "")->bytes, need->bytes);
}
