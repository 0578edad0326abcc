// parallel::sum_in_rank_order (the copy-engine exchanges' reduction) on the CPU: the sum is
// ((t0 + t1) + t2) + ... in fp32, one addition at a time, whichever term the output aliases, as
// bucketed DDP calls it (the output is this rank's own term, partial sums in another rank's slot)
// and as zero2 does (a separate output that also takes the partial sums).
#include <gtest/gtest.h>

#include <vector>

#include "lmscale/parallel/rank_order_sum.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using RankOrderSum = OpsTest;

// Terms where fp32 addition order matters: (1e8 + 1) + (-1e8) = 0, but 1e8 + (1 + -1e8) = 8 and
// (1e8 + -1e8) + 1 = 1. Element 1: small values, exact in any order.
std::vector<float> term(int q) {
  const float big[] = {1e8f, 1.0f, -1e8f, 0.5f};
  return {big[q], static_cast<float>(q) + 0.25f};
}

TEST_F(RankOrderSum, AddsInRankOrderWhicheverTermTheOutputIs) {
  for (int n : {2, 3, 4})
    for (int me = 0; me < n; ++me) {
      std::vector<std::vector<float>> h;
      std::vector<Tensor> terms;
      for (int q = 0; q < n; ++q) h.push_back(term(q));
      for (int q = 0; q < n; ++q) terms.push_back(Tensor::view(h[static_cast<std::size_t>(q)].data(), {2}, DType::f32, Device::cpu));
      float expect0 = h[0][0], expect1 = h[0][1];
      for (int q = 1; q < n; ++q) {
        expect0 = expect0 + h[static_cast<std::size_t>(q)][0];
        expect1 = expect1 + h[static_cast<std::size_t>(q)][1];
      }
      // Bucketed DDP: the output is this rank's term, scratch the first other rank's slot.
      Tensor out = terms[static_cast<std::size_t>(me)];
      Tensor scratch = terms[me == 0 ? 1 : 0];
      parallel::sum_in_rank_order(ctx, terms, out, scratch);
      EXPECT_EQ(h[static_cast<std::size_t>(me)][0], expect0) << "n " << n << " rank " << me;
      EXPECT_EQ(h[static_cast<std::size_t>(me)][1], expect1) << "n " << n << " rank " << me;
    }
  // The rank order itself: with 3 terms the first element sums to exactly 0, not 8 or 1.
  std::vector<std::vector<float>> h = {term(0), term(1), term(2)};
  std::vector<Tensor> terms;
  for (auto& v : h) terms.push_back(Tensor::view(v.data(), {2}, DType::f32, Device::cpu));
  std::vector<float> o(2, -7.0f);
  Tensor out = Tensor::view(o.data(), {2}, DType::f32, Device::cpu);
  parallel::sum_in_rank_order(ctx, terms, out, out);   // zero2: a separate output
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 0.25f + 1.25f + 2.25f);
}

}  // namespace
}  // namespace lmscale::test
