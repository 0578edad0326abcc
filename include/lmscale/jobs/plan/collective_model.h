#pragma once
// Alpha-beta models of the collectives (docs/planner.md, "Collectives"): a ring over n ranks takes
// 2(n-1) steps for an all-reduce and n-1 for a reduce-scatter or all-gather, each step costing the
// link's alpha, and moves 2(n-1)/n (all-reduce) or (n-1)/n of the buffer through each rank at the
// link's bus bandwidth beta; a double binary tree all-reduce takes 2 ceil(log2 n) steps and moves
// about twice the buffer. NCCL picks the faster; so does the model. A group inside one node runs
// on the intra-node link, a group that spans nodes on the inter-node link (each GPU its own NIC:
// NCCL runs one ring per NIC, so the bus bandwidth per rank is the NIC's).
#include <string>
#include <utility>
#include <vector>

#include "lmscale/io/config.h"
#include "lmscale/jobs/plan/cluster.h"

namespace lmscale::jobs::plan {

// A communicator's ranks and how many of them share one node.
struct Placement {
  int ranks = 1;
  int ranks_per_node = 1;
  int nodes() const { return (ranks + ranks_per_node - 1) / ranks_per_node; }
};

struct CollectiveTime {
  double seconds = 0;
  std::string algorithm;   // "ring", "tree", "p2p" or "none"
  bool inter_node = false;
};

// Ring time of `op` over n ranks, `bytes` = the whole buffer (all-reduce, broadcast), the send
// buffer (reduce-scatter) or the receive buffer (all-gather), as bench-collectives counts it.
double ring_time(CollectiveOp op, int n, double bytes, const Link& link);
double tree_all_reduce_time(int n, double bytes, const Link& link);
// The faster algorithm on the link the placement uses.
CollectiveTime collective_time(CollectiveOp op, double bytes, const Placement& where, const Cluster& c);
// One point-to-point transfer (pipeline stages): alpha + bytes / beta.
CollectiveTime p2p_time(double bytes, bool inter_node, const Cluster& c);

// Alpha and beta of a ring over n ranks fitted to measured (bytes, seconds) of `op`, minimising
// the squared relative error (so small and large messages count alike); alpha >= 0.
Link fit_ring_link(CollectiveOp op, int n, const std::vector<std::pair<double, double>>& bytes_seconds);

}  // namespace lmscale::jobs::plan
