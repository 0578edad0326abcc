// What the steps record in the model (MoE routing counts: jobs::MoeRecorder; FP8 amax histories:
// jobs::Fp8Recorder) is read without waiting for an update left in flight
// (parallel.overlap_optimizer, docs/architecture.md §4 "overlapped update"). The recorders run
// between two timed steps of bench-model; when they settled the update there, it ran outside both
// steps' timing: moe-1b on an H200 then read 34 ms a step where the wall clock said 41.7.
// Self-checking on one GPU: after a step, the update is still in flight after each recorder ran,
// and the recorders still see the step's counts. What it checks is the strategy's pending waits: a
// recorder that blocked the host on the whole device (cudaDeviceSynchronize) would pass it while
// bringing the artifact back; the recorders synchronize the compute stream only.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "lmscale/comm/mpi_environment.h"
#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/fp8_report.h"
#include "lmscale/jobs/engine/moe_report.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/ops/runtime.h"

using namespace lmscale;

namespace {

comm::MpiEnvironment& mpi_once() {
  static comm::MpiEnvironment mpi(nullptr, nullptr);
  return mpi;
}

constexpr std::int64_t kT = 32, kB = 4, kV = 101;

Config overlapped(bool moe, PrecisionMode mode) {
  Config cfg;
  cfg.model.vocab_size = kV;
  cfg.model.context_length = kT;
  cfg.model.d_model = 64;
  cfg.model.d_ff = 176;
  cfg.model.num_layers = 2;
  cfg.model.num_heads = 4;
  cfg.model.attention = AttentionImpl::flash;
  if (moe) {
    cfg.model.moe_experts = 4;
    cfg.model.moe_top_k = 2;
    cfg.model.moe_expert_dff = 48;
  }
  cfg.precision.mode = mode;
  cfg.parallel.device = DeviceChoice::cuda;
  cfg.parallel.overlap_optimizer = true;
  return cfg;
}

// One process's job environment over a results file that is never written.
struct Job {
  Config cfg;
  ops::Runtime rt{Device::cuda, 0, false};
  io::ResultsFile out{"/nonexistent/never.h5", false};
  jobs::JobEnv env{cfg, mpi_once(), rt, out, 0, 1, 0, nullptr, nullptr};
  explicit Job(Config c) : cfg(std::move(c)) {}
};

std::vector<std::int32_t> tokens(unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int32_t> v(static_cast<std::size_t>(kB * (kT + 1)));
  for (auto& x : v) x = static_cast<std::int32_t>(g() % kV);
  return v;
}

}  // namespace

TEST(Recorders, MoeCountsAreReadWithoutSettlingTheUpdate) {
  Job job(overlapped(true, PrecisionMode::bf16));
  jobs::Trainer tr(job.env, kB, 1, 3);
  jobs::MoeRecorder moe(job.env, tr, "/bench_model/moe");
  ASSERT_TRUE(moe.active());
  for (int s = 1; s <= 2; ++s) {
    tr.train_step(tokens(40 + s), kT);
    ASSERT_TRUE(tr.strategy().work_in_flight()) << "parallel.overlap_optimizer left no update in flight";
    moe.record(s);
    EXPECT_TRUE(tr.strategy().work_in_flight()) << "step " << s << ": recording the routing counts waited for the update";
    // The counts are the step's: every token's top-k assignments, in each MoE block.
    ASSERT_EQ(moe.last_rows().size(), 2u);
    for (const auto& block : moe.last_rows()) {
      double rows = 0;
      for (double r : block) rows += r;
      EXPECT_EQ(rows, static_cast<double>(kB * kT * 2));
    }
  }
  tr.settle_optimizer();
  EXPECT_FALSE(tr.strategy().work_in_flight());
}

TEST(Recorders, Fp8HistoriesAreReadWithoutSettlingTheUpdate) {
  {
    ops::Runtime probe(Device::cuda, 0, false);
    if (probe.compute_capability() / 10 != 9) GTEST_SKIP() << "FP8 GEMMs need a Hopper GPU";
  }
  Job job(overlapped(false, PrecisionMode::fp8));
  jobs::Trainer tr(job.env, kB, 1, 2);
  jobs::Fp8Recorder fp8(job.env, tr, "/bench_model");
  tr.train_step(tokens(7), kT);
  ASSERT_TRUE(tr.strategy().work_in_flight());
  fp8.record(1);
  EXPECT_TRUE(tr.strategy().work_in_flight()) << "recording the amax histories waited for the update";
}
