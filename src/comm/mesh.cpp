#include "lmscale/comm/mesh.h"

#include <algorithm>
#include <vector>

#include <fmt/ranges.h>

#include "lmscale/core/error.h"

namespace lmscale::comm {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::dp: return "dp";
    case Axis::tp: return "tp";
    case Axis::pp: return "pp";
    case Axis::shard: return "shard";
    case Axis::replicate: return "replicate";
    case Axis::ep: return "ep";
    case Axis::expert_dp: return "expert_dp";
  }
  return "?";
}

MeshShape resolve_mesh(MeshShape s, int world_size) {
  if (s.tp < 1 || s.pp < 1 || s.dp < 0 || s.shard < 0 || s.ep < 1)
    throw UsageError(fmt::format("parallel.tp={} and parallel.pp={} must be >= 1 and parallel.dp={} >= 0 (0 = derive)",
                                 s.tp, s.pp, s.dp));
  if (s.dp == 0) {
    if (world_size % (s.tp * s.pp) != 0)
      throw UsageError(fmt::format("world size {} is not divisible by parallel.tp*parallel.pp = {}*{}; change tp/pp "
                                   "or the number of ranks",
                                   world_size, s.tp, s.pp));
    s.dp = world_size / (s.tp * s.pp);
  }
  if (s.dp * s.tp * s.pp != world_size)
    throw UsageError(fmt::format("parallel.dp*tp*pp = {}*{}*{} = {} but the job has {} ranks; make them equal (dp=0 "
                                 "derives dp)",
                                 s.dp, s.tp, s.pp, s.dp * s.tp * s.pp, world_size));
  if (s.shard == 0) s.shard = s.dp;
  if (s.dp % s.shard != 0)
    throw UsageError(fmt::format("FSDP shard group size {} must divide parallel.dp = {}", s.shard, s.dp));
  if (s.dp % s.ep != 0)
    throw UsageError(fmt::format("parallel.ep = {} must divide parallel.dp = {}", s.ep, s.dp));
  return s;
}

MeshCoords mesh_coords(const MeshShape& s, int rank) {
  MeshCoords c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  c.shard = c.dp % s.shard;
  c.replicate = c.dp / s.shard;
  c.ep = c.dp % s.ep;
  c.expert_dp = c.dp / s.ep;
  return c;
}

int mesh_rank(const MeshShape& s, int pp_idx, int dp_idx, int tp_idx) { return (pp_idx * s.dp + dp_idx) * s.tp + tp_idx; }

namespace {

std::vector<int> members(const MeshShape& s, const MeshCoords& c, Axis a) {
  std::vector<int> m;
  switch (a) {
    case Axis::tp: for (int i = 0; i < s.tp; ++i) m.push_back(mesh_rank(s, c.pp, c.dp, i)); break;
    case Axis::dp: for (int i = 0; i < s.dp; ++i) m.push_back(mesh_rank(s, c.pp, i, c.tp)); break;
    case Axis::pp: for (int i = 0; i < s.pp; ++i) m.push_back(mesh_rank(s, i, c.dp, c.tp)); break;
    case Axis::shard:
      for (int i = 0; i < s.shard; ++i) m.push_back(mesh_rank(s, c.pp, c.replicate * s.shard + i, c.tp));
      break;
    case Axis::replicate:
      for (int i = 0; i < s.dp / s.shard; ++i) m.push_back(mesh_rank(s, c.pp, i * s.shard + c.shard, c.tp));
      break;
    case Axis::ep:
      for (int i = 0; i < s.ep; ++i) m.push_back(mesh_rank(s, c.pp, c.expert_dp * s.ep + i, c.tp));
      break;
    case Axis::expert_dp:
      for (int i = 0; i < s.dp / s.ep; ++i) m.push_back(mesh_rank(s, c.pp, i * s.ep + c.ep, c.tp));
      break;
  }
  return m;
}

std::string list(const std::vector<int>& m) {
  if (m.size() <= 8) return fmt::format("{}", fmt::join(m, ","));
  return fmt::format("{},{},...,{} ({})", m[0], m[1], m.back(), m.size());
}

}  // namespace

std::string describe_mesh(const MeshShape& shape, int world_size) {
  const MeshShape s = resolve_mesh(shape, world_size);
  std::string out = fmt::format(
      "mesh: {} ranks = pp {} x dp {} x tp {} (FSDP shard {} x replicate {})\n"
      "rank = (pp_idx*dp + dp_idx)*tp + tp_idx; shard_idx = dp_idx % shard, replicate_idx = dp_idx / shard\n",
      world_size, s.pp, s.dp, s.tp, s.shard, s.dp / s.shard);
  out += fmt::format("{:>6} {:>4} {:>4} {:>4} {:>6} {:>5}  {:<18} {:<18} {:<18} {:<18}\n", "rank", "pp", "dp", "tp",
                     "shard", "repl", "tp group", "dp group", "pp group", "shard group");
  const int shown = std::min(world_size, 64);
  for (int r = 0; r < shown; ++r) {
    const MeshCoords c = mesh_coords(s, r);
    out += fmt::format("{:>6} {:>4} {:>4} {:>4} {:>6} {:>5}  {:<18} {:<18} {:<18} {:<18}\n", r, c.pp, c.dp, c.tp, c.shard,
                       c.replicate, list(members(s, c, Axis::tp)), list(members(s, c, Axis::dp)),
                       list(members(s, c, Axis::pp)), list(members(s, c, Axis::shard)));
  }
  if (shown < world_size) out += fmt::format("   ... {} more ranks\n", world_size - shown);
  return out;
}

std::vector<std::vector<int>> groups_across_nodes(const MeshShape& s, Axis axis, const std::vector<int>& node_of) {
  const int world = s.dp * s.tp * s.pp;
  LMSCALE_CHECK(static_cast<int>(node_of.size()) == world, "groups_across_nodes: {} node ids for {} ranks",
                node_of.size(), world);
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world; ++r) {
    std::vector<int> m = members(s, mesh_coords(s, r), axis);
    if (m.empty() || *std::min_element(m.begin(), m.end()) != r) continue;   // each group once
    const int node = node_of[static_cast<std::size_t>(m[0])];
    if (std::any_of(m.begin(), m.end(), [&](int q) { return node_of[static_cast<std::size_t>(q)] != node; }))
      out.push_back(std::move(m));
  }
  return out;
}

Mesh::Mesh(std::shared_ptr<Communicator> world, MeshShape shape) : world_(std::move(world)) {
  shape_ = resolve_mesh(shape, world_->size());
  coords_ = mesh_coords(shape_, world_->rank());
  const MeshShape& s = shape_;
  const MeshCoords& c = coords_;
  // Every rank calls every split in the same order (split is collective over the world). The dp
  // axis of a plain DDP/ZeRO/FSDP run (dp = world) is the world communicator itself, in the same
  // order, so the data-parallel path makes no new communicator (docs/architecture.md §3); so is
  // every axis of a one-rank world. A tp or pp axis that spans the world is still split: the
  // 2-stage pipeline xl step ran 7% slower (2 H200, NCCL 2.28) with its transfers on the world
  // communicator than on a split one, for a reason not established.
  const int ranks = world_->size();
  auto group = [&](bool alias, int color, int key) {
    return alias ? world_ : std::shared_ptr<Communicator>(world_->split(color, key));
  };
  const bool one = ranks == 1;
  tp_ = group(one, c.pp * s.dp + c.dp, c.tp);
  dp_ = group(one || s.dp == ranks, c.pp * s.tp + c.tp, c.dp);
  pp_ = group(one, c.dp * s.tp + c.tp, c.pp);
  const int replicas = s.dp / s.shard;
  if (s.shard == s.dp) {
    shard_ = dp_;   // the same group in the same order
  } else {
    shard_ = group(one, (c.pp * s.tp + c.tp) * replicas + c.replicate, c.shard);
  }
  replicate_ = group(one, (c.pp * s.tp + c.tp) * s.shard + c.shard, c.replicate);
  // Expert parallelism; ep = 1 (every dense run): no ep group is made (ep() throws) and expert_dp
  // is the dp group, so nothing is split.
  if (s.ep == 1) {
    expert_dp_ = dp_;
  } else {
    const int edp = s.dp / s.ep;
    ep_ = group(one, (c.pp * s.tp + c.tp) * edp + c.expert_dp, c.ep);
    expert_dp_ = edp == s.dp ? dp_ : group(one, (c.pp * s.tp + c.tp) * s.ep + c.ep, c.expert_dp);
  }
}

Communicator& Mesh::group(Axis a) {
  std::shared_ptr<Communicator> g = group_ptr(a);
  LMSCALE_CHECK(g != nullptr, "mesh: no {} group (parallel.ep = 1 makes none)", axis_name(a));
  return *g;
}

std::shared_ptr<Communicator> Mesh::group_ptr(Axis a) const {
  switch (a) {
    case Axis::dp: return dp_;
    case Axis::tp: return tp_;
    case Axis::pp: return pp_;
    case Axis::shard: return shard_;
    case Axis::replicate: return replicate_;
    case Axis::ep: return ep_;
    case Axis::expert_dp: return expert_dp_;
  }
  return nullptr;
}

}  // namespace lmscale::comm
