// fsdp's FP8 weight gathers on the CPU (parallel/fsdp_fp8_gather.h): ranks simulated in one process
// each cast their shard of a unit with the scale of the dp group's amax, and the concatenated
// bytes are bitwise the cast of each whole scale group (a weight alone, or consecutive weights one
// FP8 layer reads as one matrix, as q|k|v) by current scaling (ops::Fp8TensorScaling), for 2, 3
// and 4 ranks and shards that split weights anywhere; with each rank's own amax instead they are
// not (the reduction is what makes them equal). And ops::Fp8Linear's forward from a quantised
// weight or group (ops::Fp8Weight) equals its forward from the compute-dtype weights, bitwise,
// state included.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_linear.h"
#include "lmscale/ops/fp8_scaling.h"
#include "lmscale/parallel/fsdp_fp8_gather.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using parallel::FsdpFp8Scales;

std::vector<std::uint8_t> bytes(const Tensor& t) {
  const auto* p = t.data_as<const std::uint8_t>();
  return {p, p + t.numel()};
}
float scalar(const Tensor& t) { return t.data_as<const float>()[0]; }

class FsdpFp8GatherTest : public OpsTest {
 protected:
  // A unit of three weights [16,48], [48,16], [16,16] (numel 768, 768, 256) whose magnitudes differ
  // by powers of two, so their scales differ; one large element per weight at a place that lands
  // in one rank's shard only.
  void SetUp() override {
    const std::vector<Shape> shapes{{16, 48}, {48, 16}, {16, 16}};
    const double stds[] = {0.02, 0.3, 3.0};
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      Tensor w = randn(shapes[k], 100 + k, stds[k], 0.0, DType::f32);
      w.data_as<float>()[(k * 397) % w.numel()] = static_cast<float>(7.5 * stds[k]);
      weights.push_back(w);
      offsets.push_back(numel);
      numel += w.numel();
    }
  }
  // Rank r's shard [s] of the unit (zero padding past the end) and its pieces, as fsdp lays them out.
  Tensor shard(int r, std::int64_t s, std::vector<FsdpFp8Scales::Piece>& pieces) {
    Tensor t = zeros({s}, DType::f32);
    const std::int64_t lo = r * s, hi = std::min(lo + s, numel);
    for (std::size_t k = 0; k < weights.size(); ++k) {
      const std::int64_t a = std::max(lo, offsets[k]), b = std::min(hi, offsets[k] + weights[k].numel());
      if (a >= b) continue;
      std::memcpy(t.data_as<float>() + (a - lo), weights[k].data_as<const float>() + (a - offsets[k]),
                  static_cast<std::size_t>(b - a) * sizeof(float));
      pieces.push_back({static_cast<int>(k), a - lo, b - a});
    }
    return t;
  }
  // Every rank's bytes concatenated [dp * s], each rank's scales object kept for its scales.
  std::vector<std::uint8_t> gathered(int dp, bool reduce, std::vector<std::unique_ptr<FsdpFp8Scales>>& ranks,
                                     const std::vector<int>& groups = {1, 1, 1}) {
    const std::int64_t s = (numel + dp - 1) / dp;
    std::vector<Tensor> shards;
    std::vector<std::vector<FsdpFp8Scales::Piece>> pieces(static_cast<std::size_t>(dp));
    std::vector<float> global(weights.size(), 0.f);
    for (int r = 0; r < dp; ++r) {
      shards.push_back(shard(r, s, pieces[static_cast<std::size_t>(r)]));
      ranks.push_back(std::make_unique<FsdpFp8Scales>(ctx, groups, 0));
      ranks.back()->local_amax(ctx, shards.back(), pieces[static_cast<std::size_t>(r)]);
      for (std::size_t k = 0; k < weights.size(); ++k)
        global[k] = std::max(global[k], ranks.back()->amax().data_as<const float>()[k]);
    }
    std::vector<std::uint8_t> out;
    for (int r = 0; r < dp; ++r) {
      auto& me = *ranks[static_cast<std::size_t>(r)];
      if (reduce) std::copy(global.begin(), global.end(), me.amax().data_as<float>());   // the all-reduce (max)
      Tensor q = Tensor::empty({s}, DType::e4m3, alloc, "test");
      me.cast(ctx, shards[static_cast<std::size_t>(r)], pieces[static_cast<std::size_t>(r)], q);
      const auto b = bytes(q);
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  }
  std::vector<Tensor> weights;
  std::vector<std::int64_t> offsets;
  std::int64_t numel = 0;
};

TEST_F(FsdpFp8GatherTest, GlobalScaleCastOfShardsEqualsCastOfWholeGroups) {
  // Every weight alone, the first two as one group (different magnitudes: the group's scale is
  // the larger one's), and all three as one.
  for (const std::vector<int>& groups : {std::vector<int>{1, 1, 1}, std::vector<int>{2, 1}, std::vector<int>{3}})
    for (int dp : {2, 3, 4}) {
      std::vector<std::unique_ptr<FsdpFp8Scales>> ranks;
      const auto got = gathered(dp, true, ranks, groups);
      std::size_t first = 0;
      for (int n : groups) {
        // The group's weights as one flat tensor [1, numel] (the cast is element-wise).
        const auto begin = weights.begin() + static_cast<std::ptrdiff_t>(first);
        const std::int64_t at = offsets[first], count = std::accumulate(
            begin, begin + n, std::int64_t{0}, [](std::int64_t a, const Tensor& w) { return a + w.numel(); });
        Tensor whole_w = Tensor::empty({1, count}, DType::f32, alloc, "test");
        for (int j = 0; j < n; ++j) {
          const Tensor& w = weights[first + static_cast<std::size_t>(j)];
          std::memcpy(whole_w.data_as<float>() + (offsets[first + static_cast<std::size_t>(j)] - at),
                      w.data_as<const float>(), static_cast<std::size_t>(w.numel()) * sizeof(float));
        }
        ops::Fp8TensorScaling whole(ctx, Fp8Format::e4m3, ops::Fp8Recipe::current, 1, 0);
        Tensor q = Tensor::empty(whole_w.shape(), DType::e4m3, alloc, "test");
        whole.quantize(ctx, whole_w, q);
        const auto want = bytes(q);
        const std::string what = "dp " + std::to_string(dp) + " group of " + std::to_string(n) + " at weight " +
                                 std::to_string(first);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + at)) << what;
        for (const auto& r : ranks)   // every rank holds the group's scales and amax, one set for its members
          for (int j = 0; j < n; ++j) {
            const ops::Fp8Weight w = r->weight(static_cast<int>(first) + j, q);
            EXPECT_EQ(scalar(w.scale), scalar(whole.scale())) << what;
            EXPECT_EQ(scalar(w.inv), scalar(whole.inv_scale())) << what;
            EXPECT_EQ(scalar(w.amax), scalar(whole.amax_history())) << what;
            EXPECT_EQ(w.scale.data(), r->weight(static_cast<int>(first), q).scale.data()) << what;
          }
        first += static_cast<std::size_t>(n);
      }
      for (std::size_t i = static_cast<std::size_t>(numel); i < got.size(); ++i)
        EXPECT_EQ(got[i], 0u) << "dp " << dp << ": padding byte " << i;
    }
  // The weights' scales really differ (a single scale for the unit would not pass the above), and
  // a group's is its largest member's.
  std::vector<std::unique_ptr<FsdpFp8Scales>> alone, paired;
  gathered(2, true, alone);
  gathered(2, true, paired, {2, 1});
  EXPECT_NE(scalar(alone[0]->weight(0, weights[0]).scale), scalar(alone[0]->weight(1, weights[1]).scale));
  EXPECT_EQ(scalar(paired[0]->weight(0, weights[0]).scale), scalar(alone[0]->weight(1, weights[1]).scale));
  EXPECT_EQ(paired[0]->groups(), 2);
  EXPECT_EQ(paired[0]->group_of(1), 0);
  EXPECT_EQ(paired[0]->group_of(2), 1);
  EXPECT_THROW(FsdpFp8Scales(ctx, std::vector<int>{2, 0}, 0), Error);
}

TEST_F(FsdpFp8GatherTest, EachRanksOwnAmaxDoesNotGiveTheWholeCast) {
  std::vector<std::unique_ptr<FsdpFp8Scales>> reduced, local;
  EXPECT_NE(gathered(2, true, reduced), gathered(2, false, local));
}

// A quantised weight into Fp8Linear: y, the saved w^T and scales, and the layer's w scaling state
// bitwise those of the forward that casts the weight itself (current scaling); the replay too.
TEST_F(FsdpFp8GatherTest, Fp8LinearFromQuantisedWeightEqualsFromWeight) {
  const Tensor x = randn({32, 48}, 7, 1.0, 0.0, DType::f32), w = weights[0];
  ops::Fp8Linear plain(ctx, {}), given(ctx, {});
  Tensor y1 = poisoned({32, 16}, DType::f32), y2 = poisoned({32, 16}, DType::f32);
  const auto s1 = plain.forward(ctx, x, w, y1);
  // The weight quantised as the gathers do (one rank holding all of it).
  FsdpFp8Scales scales(ctx, 1, 0);
  Tensor q = Tensor::empty(w.shape(), DType::e4m3, alloc, "test");
  const std::vector<FsdpFp8Scales::Piece> all{{0, 0, w.numel()}};
  const Tensor flat = w.reshape({w.numel()});
  scales.local_amax(ctx, flat, all);
  Tensor qf = q.reshape({w.numel()});
  scales.cast(ctx, flat, all, qf);
  const auto s2 = given.forward(ctx, given.quantize_input(ctx, x), scales.weight(0, q), y2);
  EXPECT_EQ(values(y1), values(y2));
  EXPECT_EQ(bytes(s1.wt_q), bytes(s2.wt_q));
  EXPECT_EQ(values(s1.scales).at(8), values(s2.scales).at(8));
  EXPECT_EQ(values(s1.scales).at(12), values(s2.scales).at(12));
  EXPECT_EQ(scalar(plain.w_scaling().scale()), scalar(given.w_scaling().scale()));
  EXPECT_EQ(scalar(plain.w_scaling().amax_history()), scalar(given.w_scaling().amax_history()));
  Tensor y3 = poisoned({32, 16}, DType::f32);
  const auto r = given.replay(ctx, s2.scales, given.replay_input(ctx, s2.scales, x, true), scales.weight(0, q), &y3);
  EXPECT_EQ(values(y1), values(y3));
  EXPECT_EQ(bytes(s1.wt_q), bytes(r.wt_q));
}

// A group's quantised weight (q|k|v-like: three [16,48] of different magnitudes, one scale) into
// the group layer: bitwise its forward from the stacked compute-dtype weights, as the model runs
// q|k|v under fsdp's FP8 gathers (model/transformer_fp8.cpp).
TEST_F(FsdpFp8GatherTest, Fp8LinearFromQuantisedGroupEqualsFromStackedWeights) {
  const Tensor x = randn({32, 48}, 7, 1.0, 0.0, DType::f32);
  Tensor stacked = Tensor::empty({48, 48}, DType::f32, alloc, "test");
  for (int j = 0; j < 3; ++j) {
    const Tensor w = randn({16, 48}, 200 + static_cast<std::uint64_t>(j), 0.02 * (1 << (3 * j)), 0.0, DType::f32);
    std::memcpy(stacked.data_as<float>() + j * 16 * 48, w.data_as<const float>(), 16 * 48 * sizeof(float));
  }
  FsdpFp8Scales scales(ctx, std::vector<int>{3}, 0);
  const std::vector<FsdpFp8Scales::Piece> pieces{{0, 0, 768}, {1, 768, 768}, {2, 1536, 768}};
  const Tensor flat = stacked.reshape({stacked.numel()});
  scales.local_amax(ctx, flat, pieces);
  Tensor q = Tensor::empty({48, 48}, DType::e4m3, alloc, "test");
  Tensor qf = q.reshape({q.numel()});
  scales.cast(ctx, flat, pieces, qf);
  ops::Fp8Linear plain(ctx, {}), given(ctx, {});
  Tensor y1 = poisoned({32, 48}, DType::f32), y2 = poisoned({32, 48}, DType::f32);
  const auto s1 = plain.forward(ctx, x, stacked, y1);
  const auto s2 = given.forward(ctx, given.quantize_input(ctx, x), scales.weight(1, q), y2);
  EXPECT_EQ(values(y1), values(y2));
  EXPECT_EQ(bytes(s1.wt_q), bytes(s2.wt_q));
  EXPECT_EQ(scalar(plain.w_scaling().scale()), scalar(given.w_scaling().scale()));
  EXPECT_EQ(scalar(plain.w_scaling().amax_history()), scalar(given.w_scaling().amax_history()));
}

}  // namespace
}  // namespace lmscale::test
