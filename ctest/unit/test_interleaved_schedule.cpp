// The interleaved 1F1B plan (parallel/interleaved_schedule.h) run by a simulator of all p ranks
// at once, with NCCL's point-to-point semantics, for every small (p, V, M):
//   - each communication point is one grouped exchange (Communicator::exchange): its ops are
//     issued in comm::canonical_order, and the group completes only when every op has met its
//     peer's (a send needs the receiver's matching recv posted, as for large NCCL messages);
//     a rank runs its steps in order, so its next exchange starts after the previous completed;
//   - sends and receives between two ranks are matched by issue order (NCCL has no tags).
// Checked: no deadlock; every forward/backward finds its input already received, and it is the
// right one (the activation of virtual stage v-1, or the gradient of v+1, of the same
// microbatch); every chunk-microbatch runs forward once and backward once, after its forward.
// The same simulator with a rank-dependent order inside a group (what an uncoordinated NCCL
// implementation would do) must find a mismatch with p = 2: the test can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/parallel/interleaved_schedule.h"

using namespace lmscale;
using parallel::InterleavedStep;

namespace {

constexpr int kForwardTag = 1, kBackwardTag = 2;   // as parallel/pipeline.cpp

// What a message carries: an activation (output of virtual stage v) or a gradient (w.r.t. the
// input of virtual stage v), of microbatch m.
struct Content {
  bool grad = false;
  int v = -1, m = -1;
  bool operator==(const Content& o) const { return grad == o.grad && v == o.v && m == o.m; }
};

std::string show(const Content& c) {
  return std::string(c.grad ? "grad" : "act") + "(v" + std::to_string(c.v) + ", m" + std::to_string(c.m) + ")";
}

using Order = std::function<std::vector<comm::P2POp>(std::vector<comm::P2POp>, int rank)>;

// Runs all ranks' plans; returns an empty string on success, else the first problem.
std::string simulate(int p, int V, int M, const Order& order) {
  struct Op {
    comm::P2POp op;
    Content content;      // send: what it carries; recv: filled when matched
    int chunk = -1;       // recv: the queue it goes to
    std::int64_t seq = 0; // n-th message of its ordered pair
    bool matched = false;
  };
  struct Rank {
    std::vector<InterleavedStep> plan;
    std::size_t pc = 0;
    std::vector<std::deque<Content>> inputs, grads;
    std::vector<Op> posted;   // the current exchange's ops (empty when not in an exchange)
    bool in_exchange = false;
    std::set<int> forwarded, backwarded;
  };
  std::vector<Rank> r(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& x = r[static_cast<std::size_t>(s)];
    x.plan = parallel::interleaved_plan(p, V, M, s);
    x.inputs.resize(static_cast<std::size_t>(V));
    x.grads.resize(static_cast<std::size_t>(V));
  }
  // Per ordered pair (from, to): how many sends / recvs have been issued; posted sends by seq.
  std::map<std::pair<int, int>, std::int64_t> sends_issued, recvs_issued;
  std::map<std::tuple<int, int, std::int64_t>, Content> in_flight;   // posted, not yet received
  std::map<std::tuple<int, int, std::int64_t>, bool> recv_posted;
  const int last_v = p * V - 1;
  auto vstage = [&](int s, int c) { return c * p + s; };
  auto fchunk = [&](int k) { return parallel::interleaved_forward_chunk(k, p, V); };
  auto bchunk = [&](int k) { return parallel::interleaved_backward_chunk(k, p, V); };
  auto micro = [&](int k) { return parallel::interleaved_microbatch(k, p, V); };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      auto& x = r[static_cast<std::size_t>(s)];
      while (x.pc < x.plan.size() && !x.in_exchange) {
        const InterleavedStep& st = x.plan[x.pc];
        if (st.kind == InterleavedStep::Kind::forward) {
          const int c = fchunk(st.k), m = micro(st.k);
          const int v = vstage(s, c);
          if (v > 0) {
            auto& q = x.inputs[static_cast<std::size_t>(c)];
            if (q.empty()) return "rank " + std::to_string(s) + ": forward " + std::to_string(st.k) + " has no input";
            const Content want{false, v - 1, m};
            if (!(q.front() == want))
              return "rank " + std::to_string(s) + ": forward of v" + std::to_string(v) + " m" + std::to_string(m) +
                     " got " + show(q.front());
            q.pop_front();
          }
          if (!x.forwarded.insert(st.k).second) return "forward twice";
        } else if (st.kind == InterleavedStep::Kind::backward) {
          const int c = bchunk(st.k), m = micro(st.k);
          const int v = vstage(s, c);
          // Backward k of chunk c runs microbatch m; its forward was the forward step with the
          // same chunk and microbatch.
          bool had_forward = false;
          for (int f : x.forwarded)
            if (fchunk(f) == c && micro(f) == m)
              had_forward = true;
          if (!had_forward) return "backward before its forward";
          if (v < last_v) {
            auto& q = x.grads[static_cast<std::size_t>(c)];
            if (q.empty())
              return "rank " + std::to_string(s) + ": backward " + std::to_string(st.k) + " has no gradient";
            const Content want{true, v + 1, m};
            if (!(q.front() == want))
              return "rank " + std::to_string(s) + ": backward of v" + std::to_string(v) + " m" + std::to_string(m) +
                     " got " + show(q.front());
            q.pop_front();
          }
          if (!x.backwarded.insert(st.k).second) return "backward twice";
        } else {
          // Post the exchange: its ops in the order the backend issues them.
          std::vector<comm::P2POp> ops;
          std::vector<Op> mine;
          const int next = (s + 1) % p, prev = (s + p - 1) % p;
          auto add = [&](comm::P2POp::Kind kind, int peer, int tag, Content content, int chunk) {
            // buf identifies the op (the simulator moves no data).
            ops.push_back({kind, reinterpret_cast<void*>(static_cast<std::uintptr_t>(mine.size() + 1)), 1,
                           DType::f32, peer, tag});
            mine.push_back({ops.back(), content, chunk});
          };
          if (st.send_output_of >= 0) {
            const int k = st.send_output_of;
            if (!x.forwarded.count(k)) return "sends the output of a forward not run";
            add(comm::P2POp::Kind::send, next, kForwardTag, {false, vstage(s, fchunk(k)), micro(k)}, -1);
          }
          if (st.recv_input_chunk >= 0) add(comm::P2POp::Kind::recv, prev, kForwardTag, {}, st.recv_input_chunk);
          if (st.send_grad_of >= 0) {
            const int k = st.send_grad_of;
            if (!x.backwarded.count(k)) return "sends the gradient of a backward not run";
            add(comm::P2POp::Kind::send, prev, kBackwardTag, {true, vstage(s, bchunk(k)), micro(k)}, -1);
          }
          if (st.recv_grad_chunk >= 0) add(comm::P2POp::Kind::recv, next, kBackwardTag, {}, st.recv_grad_chunk);
          x.posted.clear();
          for (const comm::P2POp& o : order(ops, s)) {
            Op op = mine[reinterpret_cast<std::uintptr_t>(o.buf) - 1];
            if (op.op.kind == comm::P2POp::Kind::send) {
              op.seq = sends_issued[{s, op.op.peer}]++;
              in_flight[{s, op.op.peer, op.seq}] = op.content;
            } else {
              op.seq = recvs_issued[{op.op.peer, s}]++;
              recv_posted[{op.op.peer, s, op.seq}] = true;
            }
            x.posted.push_back(op);
          }
          x.in_exchange = true;
        }
        ++x.pc;
        progress = true;
      }
    }
    // Match posted ops whose counterpart is posted (both groups active), then complete groups.
    for (int s = 0; s < p; ++s) {
      auto& x = r[static_cast<std::size_t>(s)];
      if (!x.in_exchange) continue;
      for (Op& op : x.posted) {
        if (op.matched) continue;
        if (op.op.kind == comm::P2POp::Kind::send) {
          op.matched = recv_posted.count({s, op.op.peer, op.seq}) > 0;
        } else {
          auto it = in_flight.find({op.op.peer, s, op.seq});
          if (it != in_flight.end()) {
            op.content = it->second;
            op.matched = true;
          }
        }
        if (op.matched) progress = true;
      }
      bool all = true;
      for (const Op& op : x.posted) all = all && op.matched;
      if (!all) continue;
      for (const Op& op : x.posted)
        if (op.op.kind == comm::P2POp::Kind::recv)
          (op.op.tag == kForwardTag ? x.inputs : x.grads)[static_cast<std::size_t>(op.chunk)].push_back(op.content);
      x.posted.clear();
      x.in_exchange = false;
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s) {
    const auto& x = r[static_cast<std::size_t>(s)];
    if (x.pc < x.plan.size() || x.in_exchange)
      return "deadlock: rank " + std::to_string(s) + " stuck at step " + std::to_string(x.pc) + " of " +
             std::to_string(x.plan.size());
    if (static_cast<int>(x.forwarded.size()) != M * V || static_cast<int>(x.backwarded.size()) != M * V)
      return "rank " + std::to_string(s) + " ran " + std::to_string(x.forwarded.size()) + " forwards and " +
             std::to_string(x.backwarded.size()) + " backwards of " + std::to_string(M * V);
    for (int c = 0; c < V; ++c)
      if (!x.inputs[static_cast<std::size_t>(c)].empty() || !x.grads[static_cast<std::size_t>(c)].empty())
        return "rank " + std::to_string(s) + " received tensors it never used";
  }
  return "";
}

}  // namespace

TEST(InterleavedSchedule, GroupedExchangesDeliverEveryTensorWithoutDeadlock) {
  const Order canonical = [](std::vector<comm::P2POp> ops, int) { return comm::canonical_order(std::move(ops)); };
  int cases = 0;
  for (int p : {2, 3, 4, 8})
    for (int V : {2, 3, 4})
      for (int M = p; M <= 4 * p; M += p) {
        EXPECT_EQ(simulate(p, V, M, canonical), "") << "p " << p << " V " << V << " M " << M;
        ++cases;
      }
  EXPECT_EQ(cases, 48);
}

TEST(InterleavedSchedule, RankDependentOrderInsideAGroupMismatchesWithTwoStages) {
  // Odd ranks issue the backward direction first: with p = 2 an activation and a gradient travel
  // between the same two ranks in one exchange, and NCCL's order matching swaps them.
  const Order skewed = [](std::vector<comm::P2POp> ops, int rank) {
    ops = comm::canonical_order(std::move(ops));
    auto backward_first = [](const comm::P2POp& a, const comm::P2POp& b) { return a.tag > b.tag; };
    if (rank % 2 == 1) std::stable_sort(ops.begin(), ops.end(), backward_first);
    return ops;
  };
  EXPECT_NE(simulate(2, 2, 4, skewed), "");
  EXPECT_NE(simulate(2, 3, 6, skewed), "");
}

TEST(InterleavedSchedule, CanonicalOrderIgnoresTheCallersOrder) {
  int a = 0, b = 0, c = 0;
  const comm::P2POp s1{comm::P2POp::Kind::send, &a, 1, DType::f32, 1, kBackwardTag};
  const comm::P2POp r1{comm::P2POp::Kind::recv, &b, 1, DType::f32, 1, kForwardTag};
  const comm::P2POp s0{comm::P2POp::Kind::send, &c, 1, DType::f32, 1, kForwardTag};
  const auto x = comm::canonical_order({s1, r1, s0});
  const auto y = comm::canonical_order({r1, s0, s1});
  ASSERT_EQ(x.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(x[i].buf, y[i].buf);
  EXPECT_EQ(x[0].buf, &c);   // tag 1 send, tag 1 recv, tag 2 send
  EXPECT_EQ(x[1].buf, &b);
  EXPECT_EQ(x[2].buf, &a);
}
