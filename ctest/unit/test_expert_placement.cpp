// parallel::balanced_placement: the relabelling of a block's experts that evens the ep ranks' loads
// (docs/moe.md, "Rebalancing the ep ranks"): a permutation, the busiest rank's load no higher than
// before and as low as an exhaustive search finds on small cases, experts that need not move keep
// their labels, and no relabelling when the gain is below the threshold.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "lmscale/parallel/expert_placement.h"

namespace lmscale {
namespace {

// The busiest rank's load under labels order (label i holds expert order[i]).
double busiest_of(const std::vector<double>& loads, const std::vector<int>& order, int ep) {
  const int per = static_cast<int>(loads.size()) / ep;
  std::vector<double> sum(ep, 0.0);
  for (std::size_t i = 0; i < order.size(); ++i) sum[static_cast<int>(i) / per] += loads[order[i]];
  return *std::max_element(sum.begin(), sum.end());
}

// The lowest busiest-rank load of any split of 8 experts into two groups of 4.
double best_of_two_groups(const std::vector<double>& loads) {
  double best = 1e300;
  for (int mask = 0; mask < 256; ++mask) {
    if (__builtin_popcount(mask) != 4) continue;
    double a = 0, b = 0;
    for (int e = 0; e < 8; ++e) ((mask >> e) & 1 ? a : b) += loads[e];
    best = std::min(best, std::max(a, b));
  }
  return best;
}

bool is_permutation_of_labels(const std::vector<int>& order) {
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != static_cast<int>(i)) return false;
  return true;
}

TEST(ExpertPlacement, BalancesTwoRanksAsWellAsAnExhaustiveSearch) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(0.2, 3.0);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> loads(8);
    for (double& x : loads) x = u(gen);
    const auto p = parallel::balanced_placement(loads, 2, 0.0);
    ASSERT_TRUE(is_permutation_of_labels(p.order));
    const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / 2;
    const double got = busiest_of(loads, p.order, 2);
    EXPECT_NEAR(p.busiest_after, got / mean, 1e-12);
    EXPECT_NEAR(p.busiest_before, busiest_of(loads, {0, 1, 2, 3, 4, 5, 6, 7}, 2) / mean, 1e-12);
    EXPECT_LE(got, busiest_of(loads, {0, 1, 2, 3, 4, 5, 6, 7}, 2) + 1e-12);
    // Exchanges of one and of two experts reach the best split of 8 over 2 ranks on these loads
    // (one-for-one exchanges alone ended up to 6% above it).
    EXPECT_LE(got, best_of_two_groups(loads) * (1 + 1e-12)) << "trial " << trial;
  }
}

TEST(ExpertPlacement, MovesOnlyWhatMustMove) {
  // Ranks hold {0,1} {2,3} {4,5} {6,7}; experts 0 and 1 are heavy: one of them must go, one stays.
  const std::vector<double> loads = {10, 10, 1, 1, 1, 1, 1, 1};
  const auto p = parallel::balanced_placement(loads, 4);
  ASSERT_TRUE(is_permutation_of_labels(p.order));
  EXPECT_FALSE(p.identity());
  EXPECT_EQ(p.moved, 2);   // a heavy expert for a light one
  EXPECT_NEAR(p.busiest_after, 11.0 / 6.5, 1e-12);
  // Every expert that stays on its rank keeps its label.
  for (int i = 0; i < 8; ++i)
    if (p.order[i] / 2 == i / 2) EXPECT_EQ(p.order[i], i);
  int kept = 0;
  for (int i = 0; i < 8; ++i) kept += p.order[i] == i;
  EXPECT_EQ(kept, 6);
}

TEST(ExpertPlacement, KeepsTheLabelsWhenTheRanksAreEvenOrTheGainIsSmall) {
  const auto even = parallel::balanced_placement({4, 1, 3, 2, 2, 3, 1, 4}, 2);
  EXPECT_TRUE(even.identity());
  EXPECT_NEAR(even.busiest_before, 1.0, 1e-12);
  const std::vector<int> same = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(even.order, same);
  // Before: 10.3 against 9.7 (1.03x the mean); at best 10.0: a gain of 2.9%, kept at 2%, not at 5%.
  const std::vector<double> near = {3, 3, 2.3, 2, 3, 2, 2.7, 2};
  EXPECT_FALSE(parallel::balanced_placement(near, 2, 0.02).identity());
  const auto small = parallel::balanced_placement(near, 2, 0.05);
  EXPECT_TRUE(small.identity());
  EXPECT_EQ(small.order, same);
  EXPECT_DOUBLE_EQ(small.busiest_after, small.busiest_before);
  // No rows measured: nothing to balance.
  EXPECT_TRUE(parallel::balanced_placement(std::vector<double>(8, 0.0), 2).identity());
  EXPECT_TRUE(parallel::balanced_placement({5, 1, 1, 1}, 1).identity());
}

TEST(ExpertPlacement, RefusesAnUnevenSplit) {
  EXPECT_ANY_THROW(parallel::balanced_placement({1, 2, 3}, 2));
  EXPECT_ANY_THROW(parallel::balanced_placement({1, -2}, 2));
}

}  // namespace
}  // namespace lmscale
