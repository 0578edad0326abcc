// parallel::gradient_buckets: reverse order, at most max_bytes a bucket, and a group of parameters
// that run one GEMM side by side (ParamInfo::joins_next: q|k|v, w1|w3) never split between two
// buckets, so their gradients lie back to back in every gradient layout (docs/architecture.md,
// "Fused projections").
#include <gtest/gtest.h>

#include <vector>

#include "lmscale/model/model_dims.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/parallel/grad_buckets.h"

namespace lmscale {
namespace {

// Parameters of `sizes` fp32 elements back to back; joins[i]: parameter i joins i + 1.
std::vector<model::ParamInfo> params(const std::vector<std::int64_t>& sizes, const std::vector<bool>& joins) {
  std::vector<model::ParamInfo> p;
  std::int64_t at = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    model::ParamInfo info;
    info.offset = at;
    info.numel = sizes[i];
    info.shape = {sizes[i]};
    info.joins_next = joins[i];
    p.push_back(info);
    at += sizes[i];
  }
  return p;
}

TEST(GradBuckets, AGroupLargerThanABucketStaysWhole) {
  // 8 elements a bucket; parameters 0, 1, 2 are one group of 12: {3, 4}, then {0, 1, 2}.
  const auto b = parallel::gradient_buckets(params({4, 4, 4, 2, 2}, {true, true, false, false, false}), 32.0, 4);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].first, 3);
  EXPECT_EQ(b[0].last, 4);
  EXPECT_EQ(b[1].first, 0);
  EXPECT_EQ(b[1].last, 2);
  EXPECT_EQ(b[1].offset, 0);
  EXPECT_EQ(b[1].numel, 12);
}

TEST(GradBuckets, AGroupThatDoesNotFitStartsTheNextBucket) {
  // 10 elements a bucket: {4} holds 3; the group {2, 3} (8) does not fit beside it, so it starts a
  // bucket of its own; 1 (3) does not fit beside the group, and 0 joins 1.
  const auto b = parallel::gradient_buckets(params({3, 3, 4, 4, 3}, {false, false, true, false, false}), 40.0, 4);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].first, 4);
  EXPECT_EQ(b[0].last, 4);
  EXPECT_EQ(b[1].first, 2);
  EXPECT_EQ(b[1].last, 3);
  EXPECT_EQ(b[1].numel, 8);
  EXPECT_EQ(b[2].first, 0);
  EXPECT_EQ(b[2].last, 1);
  EXPECT_EQ(b[2].offset, 0);
}

TEST(GradBuckets, WithoutTheGroupTheBoundaryFallsBetweenItsMembers) {
  // The same sizes, no group: {3, 4} (7), then 2 starts a bucket that 1 and 0 fill: the boundary
  // lies between 2 and 3, which the group above forbids.
  const auto b = parallel::gradient_buckets(params({3, 3, 4, 4, 3}, {false, false, false, false, false}), 40.0, 4);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].first, 3);
  EXPECT_EQ(b[0].last, 4);
  EXPECT_EQ(b[1].first, 0);
  EXPECT_EQ(b[1].last, 2);
}

TEST(GradBuckets, TheModelsLayoutMarksQkvAndW1W3AndNoBucketSplitsThem) {
  model::ModelDims d;
  d.vocab = 97;
  d.d_model = 32;
  d.d_ff = 96;
  d.layers = 3;
  d.heads = 4;
  const auto layout = model::parameter_layout(d);
  int groups = 0;
  for (std::size_t i = 0; i + 1 < layout.size(); ++i) {
    const std::string& n = layout[i].name;
    const bool joins = n.find("q_proj") != std::string::npos || n.find("k_proj") != std::string::npos ||
                       n.find("ffn.w1") != std::string::npos;
    EXPECT_EQ(layout[i].joins_next, joins) << n;
    groups += joins ? 1 : 0;
  }
  EXPECT_EQ(groups, 3 * 3);
  // Every bucket size from one element a bucket to all of them: no bucket starts inside a group.
  for (double bytes = 4; bytes <= 4.0 * 200000; bytes *= 1.7) {
    const auto buckets = parallel::gradient_buckets(layout, bytes, 4);
    std::int64_t covered = 0;
    for (const auto& b : buckets) {
      if (b.first > 0) EXPECT_FALSE(layout[static_cast<std::size_t>(b.first) - 1].joins_next) << bytes << " " << b.first;
      covered += b.numel;
    }
    EXPECT_EQ(covered, layout.back().offset + layout.back().numel);
  }
}

}  // namespace
}  // namespace lmscale
