#pragma once
// Process groups of a dp x tp x pp mesh (docs/architecture.md §3), plus the FSDP shard axis.
//
// Rank layout (tp fastest, then dp, then pp):
//     rank = (pp_idx * dp + dp_idx) * tp + tp_idx
// so the ranks of a tensor-parallel group are consecutive (one node, fastest links), and a
// pipeline stage is a contiguous block of dp*tp ranks.
// The dp axis splits further for FSDP/HSDP into shard x replicate:
//     shard_idx = dp_idx % shard,  replicate_idx = dp_idx / shard
// shard = dp (the default) shards over all of dp (replicate groups have one rank); shard < dp
// shards within consecutive groups of `shard` dp ranks and replicates across them.
// Expert parallelism (docs/parallel.md) splits the dp axis the same way into ep x expert_dp:
//     ep_idx = dp_idx % ep,  expert_dp_idx = dp_idx / ep
// an ep group (the all-to-all of the MoE blocks) is `ep` consecutive dp ranks; an expert_dp group
// (the dp/ep replicas of the same experts, whose expert gradients are summed) takes every ep-th.
//
// Groups: tp = same (pp, dp); dp = same (pp, tp); pp = same (dp, tp); shard = same (pp, tp,
// replicate_idx); replicate = same (pp, tp, shard_idx); ep = same (pp, tp, expert_dp_idx);
// expert_dp = same (pp, tp, ep_idx); each ordered by its own index. Each is a
// communicator of the world's backend, made with split (MPI_Comm_split / ncclCommSplit).
#include <memory>
#include <string>
#include <vector>

#include "lmscale/comm/communicator.h"

namespace lmscale::comm {

struct MeshShape {
  int dp = 0;      // 0: world size / (tp*pp)
  int tp = 1;
  int pp = 1;
  int shard = 0;   // FSDP shard group size, divides dp; 0: dp
  int ep = 1;      // expert-parallel group size, divides dp
};

struct MeshCoords {
  int pp = 0, dp = 0, tp = 0, shard = 0, replicate = 0, ep = 0, expert_dp = 0;
};

enum class Axis { dp, tp, pp, shard, replicate, ep, expert_dp };
const char* axis_name(Axis a);

// Fills dp and shard when 0 and checks dp*tp*pp == world_size and shard | dp (UsageError naming
// parallel.dp/tp/pp otherwise).
MeshShape resolve_mesh(MeshShape shape, int world_size);
MeshCoords mesh_coords(const MeshShape& resolved, int rank);
int mesh_rank(const MeshShape& resolved, int pp_idx, int dp_idx, int tp_idx);
// A printable table: the formula, then one line per rank with its coordinates and the members of
// its tp/dp/pp groups (first 64 ranks; the rest elided). Needs no MPI.
std::string describe_mesh(const MeshShape& shape, int world_size);
// The groups of `axis` whose ranks sit on more than one node, each as its rank list, given the
// node of every world rank (node_of[rank], any ids). A tensor-parallel group that spans nodes
// puts two all-reduces per sublayer on the network; ranks are laid out tp-fastest, so launching
// ranks node by node with tp <= ranks per node keeps every tp group inside a node. Needs no MPI.
std::vector<std::vector<int>> groups_across_nodes(const MeshShape& resolved, Axis axis, const std::vector<int>& node_of);

class Mesh {
 public:
  // Collective over `world`: splits every axis.
  Mesh(std::shared_ptr<Communicator> world, MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoords& coords() const { return coords_; }
  Communicator& world() { return *world_; }
  // Throws for the ep axis when ep = 1 (no group is made); group_ptr then returns null.
  Communicator& group(Axis a);
  std::shared_ptr<Communicator> group_ptr(Axis a) const;
  Communicator& dp() { return group(Axis::dp); }
  Communicator& tp() { return group(Axis::tp); }
  Communicator& pp() { return group(Axis::pp); }
  Communicator& shard() { return group(Axis::shard); }
  Communicator& replicate() { return group(Axis::replicate); }
  Communicator& ep() { return group(Axis::ep); }
  Communicator& expert_dp() { return group(Axis::expert_dp); }
  std::string describe() const { return describe_mesh(shape_, world_->size()); }

 private:
  std::shared_ptr<Communicator> world_;
  MeshShape shape_;
  MeshCoords coords_;
  std::shared_ptr<Communicator> dp_, tp_, pp_, shard_, replicate_, ep_, expert_dp_;
};

}  // namespace lmscale::comm
