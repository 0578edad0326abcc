// parallel::Spec: the layout rules the trainer and the predictors share (docs/architecture.md §4).
#include <gtest/gtest.h>

#include "lmscale/io/deck.h"
#include "lmscale/parallel/spec.h"

namespace lmscale {
namespace {

using parallel::GradStorage;
using parallel::Spec;

Spec spec_of(const std::vector<std::string>& overrides, int world) {
  return Spec::resolve(io::parse_deck_text("", overrides, world).parallel, world);
}

TEST(ParallelSpec, DegreesResolveAgainstTheWorld) {
  const Spec s = spec_of({"parallel.tp=2", "parallel.pp=2"}, 8);
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.tp, 2);
  EXPECT_EQ(s.pp, 2);
  const comm::MeshShape m = s.mesh_shape();
  EXPECT_EQ(m.dp * m.tp * m.pp, 8);
  EXPECT_EQ(m.shard, m.dp);
  EXPECT_EQ(spec_of({"train.batch_size=6"}, 3).dp, 3);
}

TEST(ParallelSpec, GradientStorageOfEveryMode) {
  // One data-parallel rank: every zero level is the one-process path (lazy 256 MiB buckets).
  for (const char* zero : {"none", "zero1", "zero2", "fsdp"}) {
    const Spec one = spec_of({std::string("parallel.zero=") + zero}, 1);
    EXPECT_EQ(one.grad_storage(), GradStorage::lazy_buckets) << zero;
    EXPECT_FALSE(one.sharded_optimizer()) << zero;
    EXPECT_FALSE(one.fsdp()) << zero;
    EXPECT_EQ(one.lazy_bucket_bytes(), parallel::kOneProcessBucketBytes) << zero;
  }
  const Spec z2 = spec_of({"parallel.zero=zero2", "parallel.bucket_mb=10"}, 2);
  EXPECT_EQ(z2.grad_storage(), GradStorage::lazy_buckets);
  EXPECT_TRUE(z2.sharded_optimizer());
  EXPECT_EQ(z2.lazy_bucket_bytes(), 10.0 * 1024 * 1024);
  for (const char* zero : {"zero1", "zero1-broadcast"})
    EXPECT_EQ(spec_of({std::string("parallel.zero=") + zero}, 2).grad_storage(), GradStorage::flat) << zero;
  EXPECT_EQ(spec_of({"parallel.ddp=bucketed"}, 2).grad_storage(), GradStorage::flat);
  const Spec f = spec_of({"parallel.zero=fsdp"}, 4);
  EXPECT_TRUE(f.fsdp());
  EXPECT_EQ(f.grad_storage(), GradStorage::shards);
  // tp takes ranks from dp: zero2 over dp 1 is the one-process path again.
  EXPECT_EQ(spec_of({"parallel.zero=zero2", "parallel.tp=2"}, 2).lazy_bucket_bytes(), parallel::kOneProcessBucketBytes);
}

}  // namespace
}  // namespace lmscale
