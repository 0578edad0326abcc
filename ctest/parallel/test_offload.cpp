// parallel.offload = optimizer (AdamW's state and update on the host) against parallel.offload =
// none: the same losses, gradient norms and final weights, bit for bit, on one process and under
// zero1, zero2 and fsdp over the MPI ranks (CPU: the host AdamW takes the CPU reference's arithmetic,
// ops/host_adamw.h).
#include <gtest/gtest.h>

#include <cstring>

#include "parallel_test_util.h"

namespace lmscale::test {
namespace {

void expect_same_run(const TrainRun& a, const TrainRun& b, const char* what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (std::size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << what << " step " << s;
    EXPECT_EQ(a.norms[s], b.norms[s]) << what << " step " << s;
  }
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float))) << what;
}

Config adamw_config() {
  Config c = tiny_config();
  c.optim.weight_decay = 0.1;   // the decoupled decay is part of the compared arithmetic
  return c;
}

TEST(Offload, OneProcessMatchesNone) {
  Config off = adamw_config();
  off.parallel.offload = OffloadMode::optimizer;
  const TrainRun base = train_run(adamw_config(), false, 4);
  const TrainRun run = train_run(off, false, 4);
  expect_same_run(base, run, "one process");
  // The run moved the weights (a test that cannot fail by comparing two untrained models).
  const TrainRun zero_steps = train_run(adamw_config(), false, 0);
  EXPECT_GT(max_rel_diff(run.params, zero_steps.params), 1e-4);
}

// zero1/zero2: the next forward gathers the parameters unit by unit as the host update lands
// (parallel/zero.h, gather_per_unit); with accumulation only the first micro-batch waits.
TEST(Offload, ZeroShardsMatchNone) {
  for (const ZeroLevel level : {ZeroLevel::zero1, ZeroLevel::zero2})
    for (const std::int64_t accum : {1, 2}) {
      Config base = adamw_config();
      base.parallel.zero = level;
      base.train.grad_accum = accum;
      Config off = base;
      off.parallel.offload = OffloadMode::optimizer;
      const std::string what = fmt::format("{}, grad_accum {}", level, accum);
      expect_same_run(train_run(base, true, 3), train_run(off, true, 3), what.c_str());
    }
}

// FSDP: the shards' master and moments on the host, updated by the worker while the next forward
// runs (parallel/offloaded_shards.h); with accumulation, and with a chunk boundary inside a unit.
// optimizer+params: the 16-bit shard on the host too, copied up before each gather.
TEST(Offload, FsdpMatchesNone) {
  for (const OffloadMode mode : {OffloadMode::optimizer, OffloadMode::optimizer_params})
    for (const std::int64_t accum : {1, 2}) {
      Config base = adamw_config();
      base.parallel.zero = ZeroLevel::fsdp;
      base.train.grad_accum = accum;
      Config off = base;
      off.parallel.offload = mode;
      const TrainRun a = train_run(base, true, 4), b = train_run(off, true, 4);
      const std::string what = fmt::format("fsdp, offload {}, grad_accum {}", mode, accum);
      expect_same_run(a, b, what.c_str());
    }
}

}  // namespace
}  // namespace lmscale::test
