// Deep models' memory phases are extrapolated from two shallower replays (jobs/predict/
// memory_model.h, issue 36 item 5): beyond kMaxReplayedLayers blocks, predict_memory_phases must
// agree with the block-by-block replay of the same depth, phase by phase, under every layout whose
// blocks repeat (one process, DDP buckets, zero2, FSDP, tp, every-k groups, 1F1B (also with FSDP
// stages) and interleaved pipelines) within one gradient bucket (exactly for one process, whose
// first bucket holds the head's gradients), and stay the replay itself up to that depth.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "lmscale/jobs/predict/memory_model.h"

using namespace lmscale;

namespace {

// A small model (d 64, 4 heads, F 256, V 512, T 32), trained in fp32 on the CPU.
Config small(std::int64_t layers) {
  Config c;
  c.run.job = JobKind::train;
  c.model.vocab_size = 512;
  c.model.d_model = 64;
  c.model.d_ff = 256;
  c.model.num_heads = 4;
  c.model.context_length = 32;
  c.model.num_layers = layers;
  c.parallel.device = DeviceChoice::cpu;
  c.train.batch_size = 4;
  return c;
}

// The gradient buckets of these layouts hold at most 256 MiB: where their edges fall moves the
// replayed phases by up to one bucket, the extrapolation's bound.
constexpr double kBucket = 256.0 * 1024 * 1024;

// Every phase of the extrapolation within `tolerance` bytes of the replay at the same depth.
void expect_extrapolation_matches(const Config& c, int world, int rank, double tolerance, const std::string& what) {
  ASSERT_GT(c.model.num_layers, jobs::kMaxReplayedLayers) << what;
  const auto predicted = jobs::predict_memory_phases(c, world, false, rank);
  const auto replayed = jobs::replay_memory_phases(c, world, false, rank);
  EXPECT_NE(predicted.layout.find("extrapolated"), std::string::npos) << what << ": " << predicted.layout;
  ASSERT_EQ(predicted.phases.size(), replayed.phases.size()) << what;
  for (std::size_t i = 0; i < replayed.phases.size(); ++i) {
    EXPECT_EQ(predicted.phases[i].phase, replayed.phases[i].phase) << what;
    EXPECT_NEAR(predicted.phases[i].bytes, replayed.phases[i].bytes, tolerance)
        << what << ", phase " << replayed.phases[i].phase << ": extrapolated " << predicted.phases[i].bytes
        << " bytes, replayed " << replayed.phases[i].bytes;
  }
  EXPECT_NEAR(predicted.peak, replayed.peak, tolerance) << what;
}

}  // namespace

TEST(MemoryExtrapolation, ShallowModelsAreReplayed) {
  const Config c = small(jobs::kMaxReplayedLayers);
  const auto predicted = jobs::predict_memory_phases(c, 1, false, 0);
  const auto replayed = jobs::replay_memory_phases(c, 1, false, 0);
  EXPECT_EQ(predicted.layout.find("extrapolated"), std::string::npos);
  ASSERT_EQ(predicted.phases.size(), replayed.phases.size());
  for (std::size_t i = 0; i < replayed.phases.size(); ++i)
    EXPECT_DOUBLE_EQ(predicted.phases[i].bytes, replayed.phases[i].bytes);
}

TEST(MemoryExtrapolation, OneProcessIsExactAndEveryKGroupsWithinABucket) {
  expect_extrapolation_matches(small(100003), 1, 0, 1.0, "one process");
  Config k = small(100003);
  k.train.activation_checkpointing = Checkpointing::every_k;
  k.train.checkpoint_k = 3;   // 100003 = 3 x 33334 + 1: a partial last group
  expect_extrapolation_matches(k, 1, 0, kBucket, "every-k, k = 3");
}

TEST(MemoryExtrapolation, DataParallelLayoutsAgreeWithinABucket) {
  Config ddp = small(100003);
  ddp.parallel.ddp = DdpKind::bucketed;
  ddp.parallel.bucket_mb = 1;   // about 8 blocks' gradients per bucket: bucket edges fall anywhere
  expect_extrapolation_matches(ddp, 2, 0, kBucket, "bucketed ddp");
  Config zero2 = small(100003);
  zero2.parallel.zero = ZeroLevel::zero2;
  expect_extrapolation_matches(zero2, 2, 1, kBucket, "zero2, rank 1");
  Config fsdp = small(100003);
  fsdp.parallel.zero = ZeroLevel::fsdp;
  fsdp.parallel.ddp = DdpKind::none;
  expect_extrapolation_matches(fsdp, 2, 0, kBucket, "fsdp");
  Config tp = small(100003);
  tp.parallel.tp = 2;
  expect_extrapolation_matches(tp, 2, 1, kBucket, "tp 2, rank 1");
}

TEST(MemoryExtrapolation, PipelineStagesAgree) {
  Config pp = small(100003);   // stages of 50002 and 50001 blocks
  pp.parallel.pp = 2;
  pp.parallel.microbatches = 2;
  expect_extrapolation_matches(pp, 2, 0, kBucket, "1F1B, stage 0");
  expect_extrapolation_matches(pp, 2, 1, kBucket, "1F1B, stage 1");
  Config interleaved = small(100004);
  interleaved.parallel.pp = 2;
  interleaved.parallel.microbatches = 2;
  interleaved.parallel.schedule = PipelineSchedule::interleaved;
  interleaved.parallel.virtual_stages = 2;
  expect_extrapolation_matches(interleaved, 2, 1, kBucket, "interleaved, stage 1");
  // fsdp over dp 2 x pp 2 (ranks 0, 1: stage 0; 2, 3: stage 1): no buckets, every block adds the
  // same shard, state and activations, so the line holds to rounding.
  Config fsdp = small(100003);
  fsdp.parallel.pp = 2;
  fsdp.parallel.microbatches = 2;
  fsdp.parallel.zero = ZeroLevel::fsdp;
  fsdp.parallel.ddp = DdpKind::none;
  expect_extrapolation_matches(fsdp, 4, 0, 1024, "fsdp 1F1B, stage 0");
  expect_extrapolation_matches(fsdp, 4, 2, 1024, "fsdp 1F1B, stage 1");
}
