// The load-balanced relabelling of one MoE block's experts over the ep ranks (parallel/expert_placement.h).
#include "lmscale/parallel/expert_placement.h"

#include <algorithm>
#include <numeric>

#include "lmscale/core/error.h"

namespace lmscale::parallel {

namespace {

// The busiest rank's summed load, with rank_of[e] the rank of label e.
double busiest(const std::vector<double>& loads, const std::vector<int>& rank_of, int ep) {
  std::vector<double> sum(ep, 0.0);
  for (std::size_t e = 0; e < loads.size(); ++e) sum[rank_of[e]] += loads[e];
  return *std::max_element(sum.begin(), sum.end());
}

// The heaviest expert first, each to the least loaded group with room: ep groups of per_rank
// experts (group_of[e] for every label e).
std::vector<int> greedy_groups(const std::vector<double>& loads, int ep, int per_rank) {
  const int E = static_cast<int>(loads.size());
  std::vector<int> by_load(E);
  std::iota(by_load.begin(), by_load.end(), 0);
  std::stable_sort(by_load.begin(), by_load.end(), [&](int a, int b) { return loads[a] > loads[b]; });
  std::vector<double> load(ep, 0.0);
  std::vector<int> room(ep, per_rank), group_of(E, 0);
  for (int e : by_load) {
    int best = -1;
    for (int r = 0; r < ep; ++r)
      if (room[r] > 0 && (best < 0 || load[r] < load[best])) best = r;
    group_of[e] = best;
    load[best] += loads[e];
    --room[best];
  }
  return group_of;
}

// Improves groups in place by exchanges of one or two experts of the busiest group for as many of
// another group, while one lowers the busiest group's load without making the other busier than it
// was (each brings two loads closer, so the sum of squares falls and this ends); returns the
// busiest group's load. Two-for-two exchanges get out of most states where no single swap helps.
double improve_by_swaps(const std::vector<double>& loads, int ep, std::vector<int>& group_of) {
  const int E = static_cast<int>(loads.size());
  std::vector<double> load(ep, 0.0);
  for (int e = 0; e < E; ++e) load[group_of[e]] += loads[e];
  for (int round = 0; round < E * E; ++round) {
    const int b = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    std::vector<int> out, in;   // the best exchange found: out of b, into b
    double best_peak = load[b];
    auto consider = [&](std::vector<int> from_b, std::vector<int> to_b) {
      double d = 0;   // load leaving b
      for (int e : from_b) d += loads[e];
      for (int f : to_b) d -= loads[f];
      const double peak = std::max(load[b] - d, load[group_of[to_b[0]]] + d);
      if (peak < best_peak) best_peak = peak, out = std::move(from_b), in = std::move(to_b);
    };
    for (int e = 0; e < E; ++e)
      for (int f = 0; f < E && group_of[e] == b; ++f)
        if (group_of[f] != b) consider({e}, {f});
    if (out.empty())
      for (int e1 = 0; e1 < E; ++e1)
        for (int e2 = e1 + 1; e2 < E && group_of[e1] == b; ++e2)
          for (int f1 = 0; f1 < E && group_of[e2] == b; ++f1)
            for (int f2 = f1 + 1; f2 < E && group_of[f1] != b; ++f2)
              if (group_of[f2] == group_of[f1]) consider({e1, e2}, {f1, f2});
    if (out.empty()) break;
    const int o = group_of[in[0]];
    for (int e : out) load[b] -= loads[e], load[o] += loads[e], group_of[e] = o;
    for (int f : in) load[o] -= loads[f], load[b] += loads[f], group_of[f] = b;
  }
  return *std::max_element(load.begin(), load.end());
}

}  // namespace

ExpertPlacement balanced_placement(const std::vector<double>& loads, int ep, double min_gain) {
  const int E = static_cast<int>(loads.size());
  LMSCALE_CHECK(ep >= 1 && E > 0 && E % ep == 0, "expert placement: {} experts over {} ranks", E, ep);
  for (double x : loads) LMSCALE_CHECK(x >= 0, "expert placement: a negative load {}", x);
  const int per_rank = E / ep;
  ExpertPlacement out;
  out.order.resize(E);
  std::iota(out.order.begin(), out.order.end(), 0);
  const double total = std::accumulate(loads.begin(), loads.end(), 0.0);
  if (total <= 0) return out;
  const double mean = total / ep;
  std::vector<int> rank_now(E);
  for (int e = 0; e < E; ++e) rank_now[e] = e / per_rank;
  const double before = busiest(loads, rank_now, ep);
  out.busiest_before = out.busiest_after = before / mean;
  if (ep == 1) return out;
  // Step 1, from two starts: the greedy groups, and the current ranks (which moves the fewest
  // experts when it balances as well).
  std::vector<int> group_of = greedy_groups(loads, ep, per_rank), from_now = rank_now;
  const double greedy_peak = improve_by_swaps(loads, ep, group_of);
  if (improve_by_swaps(loads, ep, from_now) <= greedy_peak * (1 + 1e-12)) group_of = from_now;
  // Step 2: each group to the rank holding most of its experts (greedy over (group, rank) pairs,
  // the largest overlap first; ties to the lower group, then the lower rank).
  std::vector<std::vector<int>> overlap(ep, std::vector<int>(ep, 0));
  for (int e = 0; e < E; ++e) ++overlap[group_of[e]][rank_now[e]];
  std::vector<int> rank_of_group(ep, -1), group_on_rank(ep, -1);
  for (int k = 0; k < ep; ++k) {
    int bg = -1, br = -1;
    for (int g = 0; g < ep; ++g)
      for (int r = 0; r < ep; ++r)
        if (rank_of_group[g] < 0 && group_on_rank[r] < 0 && (bg < 0 || overlap[g][r] > overlap[bg][br])) bg = g, br = r;
    rank_of_group[bg] = br;
    group_on_rank[br] = bg;
  }
  std::vector<int> rank_new(E);
  for (int e = 0; e < E; ++e) rank_new[e] = rank_of_group[group_of[e]];
  const double after = busiest(loads, rank_new, ep);
  // Step 3: worth moving?
  if (before - after < min_gain * before) return out;
  // Labels: an expert staying on its rank keeps its label; the arrivals (in label order) take the
  // labels the departures left, in label order.
  std::vector<int> order(E, -1);
  for (int e = 0; e < E; ++e)
    if (rank_new[e] == rank_now[e]) order[e] = e;
  int moved = 0;
  for (int r = 0; r < ep; ++r) {
    int slot = r * per_rank;
    for (int e = 0; e < E; ++e) {
      if (rank_new[e] != r || rank_now[e] == r) continue;
      while (order[slot] >= 0) ++slot;
      order[slot] = e;
      ++moved;
    }
  }
  out.order = std::move(order);
  out.busiest_after = after / mean;
  out.moved = moved;
  return out;
}

}  // namespace lmscale::parallel
