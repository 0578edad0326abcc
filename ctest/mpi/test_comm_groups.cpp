// split() and the dp x tp x pp mesh on the mpi backend: group sizes, rank order, members, and
// collectives confined to their group.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "lmscale/comm/mesh.h"
#include "lmscale/comm/mpi_communicator.h"
#include "mpi_test_support.h"

namespace lmscale::comm {
namespace {

// World ranks of the members of `c`, in c's rank order.
std::vector<int> members_of(Communicator& c, int world_rank) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(c.size()), -1);
  std::int32_t me = world_rank;
  c.all_gather(&me, all.data(), 1, DType::i32);
  return std::vector<int>(all.begin(), all.end());
}

TEST(Split, EvenAndOddRanks) {
  auto& env = test::mpi_env();
  MpiCommunicator world(env.world(), MpiOptions{Algo::automatic, true});
  const int p = world.size(), r = world.rank();
  auto half = world.split(r % 2, r);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->size(), (p - r % 2 + 1) / 2);
  EXPECT_EQ(half->rank(), r / 2);
  EXPECT_TRUE(half->check());   // inherited
  std::vector<int> want;
  for (int q = r % 2; q < p; q += 2) want.push_back(q);
  EXPECT_EQ(members_of(*half, r), want);
  // A sum confined to the group.
  std::int64_t x = r, sum = 0;
  half->all_reduce(&x, &sum, 1, DType::i64, ReduceOp::sum);
  std::int64_t expect = 0;
  for (int q : want) expect += q;
  EXPECT_EQ(sum, expect);
  // The group's own async work does not disturb the parent's.
  std::vector<float> a(1 << 14, 1.0f), b(1 << 14, 1.0f);
  Work wa = half->all_reduce(a.data(), a.data(), a.size(), DType::f32, ReduceOp::sum, async_call());
  Work wb = world.all_reduce(b.data(), b.data(), b.size(), DType::f32, ReduceOp::sum, async_call());
  wa.wait();
  wb.wait();
  EXPECT_EQ(a[77], static_cast<float>(half->size()));
  EXPECT_EQ(b[77], static_cast<float>(p));
}

TEST(Split, KeyOrdersRanksAndNegativeColorOptsOut) {
  MpiCommunicator world(test::mpi_env().world());
  const int p = world.size(), r = world.rank();
  auto reversed = world.split(0, -r);
  ASSERT_NE(reversed, nullptr);
  EXPECT_EQ(reversed->rank(), p - 1 - r);
  auto without_zero = world.split(r == 0 ? -1 : 0, r);
  if (r == 0) {
    EXPECT_EQ(without_zero, nullptr);
  } else {
    ASSERT_NE(without_zero, nullptr);
    EXPECT_EQ(without_zero->size(), p - 1);
    EXPECT_EQ(without_zero->rank(), r - 1);
  }
}

// All factorisations of the world size into pp x dp x tp (and shard sizes dividing dp).
std::vector<MeshShape> shapes(int world) {
  std::vector<MeshShape> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp) {
      if (world % (tp * pp)) continue;
      const int dp = world / (tp * pp);
      for (int shard = 1; shard <= dp; ++shard)
        if (dp % shard == 0) out.push_back(MeshShape{dp, tp, pp, shard});
      // Expert parallelism splits dp into ep x expert_dp.
      for (int ep = 2; ep <= dp; ++ep)
        if (dp % ep == 0) out.push_back(MeshShape{dp, tp, pp, dp, ep});
    }
  return out;
}

TEST(Mesh, GroupsMatchTheDocumentedLayout) {
  auto& env = test::mpi_env();
  auto world = std::make_shared<MpiCommunicator>(env.world());
  const int n = world->size(), r = world->rank();
  for (const MeshShape& s : shapes(n)) {
    Mesh mesh(world, s);
    const MeshCoords c = mesh.coords();
    SCOPED_TRACE(fmt::format("dp {} tp {} pp {} shard {} ep {} rank {}", s.dp, s.tp, s.pp, s.shard, s.ep, r));
    EXPECT_EQ(c.dp, c.expert_dp * s.ep + c.ep);   // ep consecutive dp ranks form an ep group
    EXPECT_EQ(mesh_rank(mesh.shape(), c.pp, c.dp, c.tp), r);
    EXPECT_EQ(r, (c.pp * s.dp + c.dp) * s.tp + c.tp);   // the documented formula
    // Members computed independently: every world rank whose other coordinates match.
    auto expect_members = [&](Axis a) {
      std::vector<int> want;
      for (int q = 0; q < n; ++q) {
        const MeshCoords o = mesh_coords(mesh.shape(), q);
        bool same = false;
        switch (a) {
          case Axis::tp: same = o.pp == c.pp && o.dp == c.dp; break;
          case Axis::dp: same = o.pp == c.pp && o.tp == c.tp; break;
          case Axis::pp: same = o.dp == c.dp && o.tp == c.tp; break;
          case Axis::shard: same = o.pp == c.pp && o.tp == c.tp && o.replicate == c.replicate; break;
          case Axis::replicate: same = o.pp == c.pp && o.tp == c.tp && o.shard == c.shard; break;
          case Axis::ep: same = o.pp == c.pp && o.tp == c.tp && o.expert_dp == c.expert_dp; break;
          case Axis::expert_dp: same = o.pp == c.pp && o.tp == c.tp && o.ep == c.ep; break;
        }
        if (same) want.push_back(q);
      }
      EXPECT_EQ(members_of(mesh.group(a), r), want) << axis_name(a);
    };
    for (Axis a : {Axis::tp, Axis::dp, Axis::pp, Axis::shard, Axis::replicate, Axis::expert_dp}) expect_members(a);
    if (s.ep > 1) {
      expect_members(Axis::ep);
      EXPECT_EQ(mesh.ep().size(), s.ep);
      EXPECT_EQ(mesh.ep().rank(), c.ep);
    } else {
      EXPECT_EQ(mesh.group_ptr(Axis::ep), nullptr);   // ep = 1 makes no group
      EXPECT_THROW(mesh.ep(), Error);
    }
    EXPECT_EQ(mesh.expert_dp().size(), s.dp / s.ep);
    EXPECT_EQ(mesh.expert_dp().rank(), c.expert_dp);
    EXPECT_EQ(mesh.tp().size(), s.tp);
    EXPECT_EQ(mesh.dp().size(), s.dp);
    EXPECT_EQ(mesh.pp().size(), s.pp);
    EXPECT_EQ(mesh.shard().size(), s.shard);
    EXPECT_EQ(mesh.replicate().size(), s.dp / s.shard);
    EXPECT_EQ(mesh.tp().rank(), c.tp);
    EXPECT_EQ(mesh.dp().rank(), c.dp);
    EXPECT_EQ(mesh.pp().rank(), c.pp);
  }
}

TEST(Mesh, DescribeAndBadShapes) {
  const int n = test::mpi_env().size();
  const std::string d = describe_mesh(MeshShape{0, 1, 1, 0}, n);
  EXPECT_NE(d.find("rank = (pp_idx*dp + dp_idx)*tp + tp_idx"), std::string::npos) << d;
  EXPECT_NE(d.find(fmt::format("{} ranks = pp 1 x dp {} x tp 1", n, n)), std::string::npos) << d;
  EXPECT_EQ(resolve_mesh(MeshShape{0, n, 1, 0}, n).dp, 1);
  EXPECT_THROW(resolve_mesh(MeshShape{n + 1, 1, 1, 0}, n), UsageError);
  EXPECT_THROW(resolve_mesh(MeshShape{0, n + 1, 1, 0}, n), UsageError);
  EXPECT_THROW(resolve_mesh(MeshShape{n, 1, 1, n + 1}, n), UsageError);
  // 8 ranks as 2 x 2 x 2 (no MPI needed): rank 5 = pp 1, dp 0, tp 1.
  const std::string d8 = describe_mesh(MeshShape{2, 2, 2, 0}, 8);
  EXPECT_NE(d8.find("     5    1    0    1      0     0  4,5                5,7                1,5"), std::string::npos) << d8;
}

}  // namespace
}  // namespace lmscale::comm

// Placement on nodes (multi-node runs): tp groups must stay inside a node; the check is pure.
TEST(Mesh, GroupsAcrossNodes) {
  using lmscale::comm::Axis;
  using lmscale::comm::groups_across_nodes;
  using lmscale::comm::MeshShape;
  using lmscale::comm::resolve_mesh;
  // 2 nodes x 2 ranks, launched node by node: node_of = {0,0,1,1}.
  const std::vector<int> two_by_two = {0, 0, 1, 1};
  // tp=2: groups {0,1} and {2,3}, each inside a node; dp groups {0,2},{1,3} cross (expected).
  const MeshShape tp2 = resolve_mesh(MeshShape{0, 2, 1, 0}, 4);
  EXPECT_TRUE(groups_across_nodes(tp2, Axis::tp, two_by_two).empty());
  EXPECT_EQ(groups_across_nodes(tp2, Axis::dp, two_by_two), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  // tp=4 on 2 nodes: the one tp group spans both.
  const MeshShape tp4 = resolve_mesh(MeshShape{0, 4, 1, 0}, 4);
  EXPECT_EQ(groups_across_nodes(tp4, Axis::tp, two_by_two), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  // tp=2 but ranks placed round-robin (cyclic distribution): every tp group spans nodes.
  EXPECT_EQ(groups_across_nodes(tp2, Axis::tp, {0, 1, 0, 1}), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  // one node: nothing spans
  EXPECT_TRUE(groups_across_nodes(tp4, Axis::tp, {7, 7, 7, 7}).empty());
  EXPECT_THROW(groups_across_nodes(tp4, Axis::tp, {0, 0}), lmscale::Error);
}
