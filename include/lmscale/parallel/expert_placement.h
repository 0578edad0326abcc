#pragma once
// Where the experts of one MoE block sit on the ep ranks (docs/moe.md, "Rebalancing the ep
// ranks"). Expert parallelism puts labels [r El, (r+1) El) on ep rank r (El = E / ep); at every
// block's all-to-all each rank waits for the one whose experts got the most rows. Relabelling the
// experts (expert i's weights, optimizer state and router row all move to label j) gives the same
// model, since the router's scores move with the weights, and lets the labels be chosen so that the
// ranks' loads are even: this is that choice, from measured loads. The state moves in
// jobs/engine/expert_rebalance.h.
#include <vector>

namespace lmscale::parallel {

struct ExpertPlacement {
  // order[i] = the current label of the expert that takes label i (a permutation of 0 .. E-1);
  // the identity keeps every expert where it is.
  std::vector<int> order;
  // The busiest ep rank's load over the mean rank's under the current labels and under `order`
  // (1 is even; 0 when no load was measured).
  double busiest_before = 0, busiest_after = 0;
  int moved = 0;   // experts whose rank changes
  bool identity() const { return moved == 0; }
};

// The relabelling of E = loads.size() experts over `ep` ranks (ep divides E) that balances the
// ranks' summed loads (loads[e]: rows routed to current label e, >= 0):
//   1. a partition into ep groups of E / ep experts: exchanges of one or two experts of the
//      busiest group for as many of another group while one lowers the busiest group's load
//      (a local search, not an exhaustive one), from two starts (the
//      heaviest expert first, each to the group with the least load and room; and the current
//      ranks), the better kept (the current ranks' on a tie: fewer experts move);
//   2. each group given to the rank that already holds most of its experts, and an expert that
//      stays on its rank keeps its label: what moves is what must;
//   3. kept only if it lowers the busiest rank's load by at least min_gain of it (moving state
//      costs a step's worth of host copies); otherwise the identity.
// Deterministic: ties go to the lower label and the lower rank, so every rank computes the same.
ExpertPlacement balanced_placement(const std::vector<double>& loads, int ep, double min_gain = 0.02);

}  // namespace lmscale::parallel
