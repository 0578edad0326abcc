// The trainer's state as pieces of named parameters (include/lmscale/jobs/engine/trainer_state.h).
#include "lmscale/jobs/engine/trainer_state.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/parallel/fsdp.h"
#include "lmscale/parallel/tensor_parallel.h"
#include "lmscale/parallel/zero.h"

namespace lmscale::jobs {

namespace {

// Where this rank sits among the ranks that hold the same copy of a parameter's state.
struct Mesh {
  int dp = 1, dp_rank = 0;   // data-parallel replicas (the world without a mesh)
  int tp = 1, tp_rank = 0;   // tensor-parallel group (replicated parameters: the norms)
};

Mesh mesh_of(Trainer& t) {
  Mesh m;
  m.dp = t.dp_size();
  m.dp_rank = t.dp_rank();
  if (auto* tp = t.tensor_parallel()) {
    m.tp = tp->degree();
    m.tp_rank = tp->split().rank;
  }
  return m;
}

// Under tensor parallelism, parameters the tp ranks hold whole (norms) are replicated over them.
bool tp_replicated(const model::ParamInfo& p, const Mesh& m) { return m.tp > 1 && p.split_dim < 0; }

// Adds the pieces of local elements [lo, hi) of store parameter i, in full-parameter coordinates
// (parallel::append_full_pieces).
void add_pieces(std::vector<parallel::StatePiece>& out, const model::ParameterStore& ps, int i, std::int64_t lo,
                std::int64_t hi, const Tensor& master, const Tensor& m, const Tensor& v) {
  parallel::append_full_pieces(out, ps.infos()[static_cast<std::size_t>(i)], ps.global_index(i), lo, hi, master, m, v);
}

// One process, DDP, and tp / pp without a sharded optimizer: every rank holds all of its store;
// the replicas of each piece (dp ranks; dp x tp ranks for tp-replicated norms) each write a
// near-equal slice of it.
parallel::StateLayout replicated(Trainer& t) {
  parallel::StateLayout out;
  const auto& ps = t.params();
  const Mesh mesh = mesh_of(t);
  optim::Optimizer& opt = *t.optimizer();
  for (int i = 0; i < ps.size(); ++i) {
    const auto& p = ps.infos()[static_cast<std::size_t>(i)];
    // m, v: the optimizer's state tensors 0 and 1 (empty where it holds none, e.g. sgd's v).
    auto views = [&](std::int64_t a, std::int64_t b) {
      return std::array<Tensor, 3>{t.params().flat_params().flat_range(p.offset + a, b - a),
                                   parallel::state_view(opt, 0, p.offset + a, b - a),
                                   parallel::state_view(opt, 1, p.offset + a, b - a)};
    };
    auto all = views(0, p.numel);
    add_pieces(out.load, ps, i, 0, p.numel, all[0], all[1], all[2]);
    const bool rep = tp_replicated(p, mesh);
    const auto [a, b] = parallel::slice_of(p.numel, rep ? mesh.dp_rank * mesh.tp + mesh.tp_rank : mesh.dp_rank,
                                           rep ? mesh.dp * mesh.tp : mesh.dp);
    if (a < b) {
      auto mine = views(a, b);
      add_pieces(out.save, ps, i, a, b, mine[0], mine[1], mine[2]);
    }
  }
  return out;
}

// zero1/zero2 (over the dp ranks): the master is replicated (every rank loads all of its store),
// m and v exist for this rank's range of the flat buffer only; the range, cut at parameter
// boundaries, is what it writes (tp-replicated norms: split once more among the tp ranks, which
// hold identical copies).
parallel::StateLayout zero_shard(Trainer& t, parallel::ZeroOptimizer& zero) {
  parallel::StateLayout out;
  const auto& ps = t.params();
  const Mesh mesh = mesh_of(t);
  const std::int64_t lo = zero.shard_begin(0), hi = lo + zero.shard_size(0);
  optim::Optimizer& opt = zero.group_optimizer(0);
  for (int i = 0; i < ps.size(); ++i) {
    const auto& p = ps.infos()[static_cast<std::size_t>(i)];
    add_pieces(out.load, ps, i, 0, p.numel, t.params().flat_params().flat_range(p.offset, p.numel), Tensor(), Tensor());
    const std::int64_t a = std::max(lo, p.offset) - p.offset, b = std::min(hi, p.offset + p.numel) - p.offset;
    if (a >= b) continue;
    auto views = [&](std::int64_t x, std::int64_t y) {
      return std::array<Tensor, 3>{t.params().flat_params().flat_range(p.offset + x, y - x),
                                   parallel::state_view(opt, 0, p.offset + x - lo, y - x),
                                   parallel::state_view(opt, 1, p.offset + x - lo, y - x)};
    };
    auto held = views(a, b);
    add_pieces(out.load, ps, i, a, b, Tensor(), held[1], held[2]);
    std::int64_t sa = a, sb = b;
    if (tp_replicated(p, mesh)) {
      const auto [ta, tb] = parallel::slice_of(p.numel, mesh.tp_rank, mesh.tp);
      sa = std::max(a, ta);
      sb = std::min(b, tb);
    }
    if (sa < sb) {
      auto mine = views(sa, sb);
      add_pieces(out.save, ps, i, sa, sb, mine[0], mine[1], mine[2]);
    }
  }
  return out;
}

parallel::ZeroOptimizer* zero_of(Trainer& t) { return dynamic_cast<parallel::ZeroOptimizer*>(t.sharded()); }

}  // namespace

parallel::StateLayout describe_state(Trainer& t) {
  if (t.fsdp()) return t.fsdp()->state_layout();   // its dp shards of (tp slices of) parameters
  if (auto* zero = zero_of(t)) return zero_shard(t, *zero);
  LMSCALE_CHECK(t.optimizer() != nullptr, "describe_state: a trainer without an optimizer");
  return replicated(t);
}

std::int64_t optimizer_steps(Trainer& t) {
  if (t.sharded()) return t.sharded()->steps();
  return t.optimizer()->steps();
}

void set_optimizer_steps(Trainer& t, std::int64_t steps) {
  if (t.fsdp()) return t.fsdp()->set_steps(steps);
  if (auto* zero = zero_of(t)) return zero->group_optimizer(0).set_steps(steps);
  t.optimizer()->set_steps(steps);
}

std::string layout_name(const Trainer& t, const Config& cfg, int world) {
  (void)t;
  if (world == 1) return "one process";
  const auto& p = cfg.parallel;
  std::string mode = p.zero != ZeroLevel::none ? to_string(p.zero)
                                                : "ddp " + (p.ddp == DdpKind::none ? std::string("flat") : to_string(p.ddp));
  if (p.tp > 1) mode += fmt::format(" x tp {}{}", p.tp, p.sequence_parallel ? " (sequence parallel)" : "");
  if (p.pp > 1) mode += fmt::format(" x pp {} ({})", p.pp, p.schedule);
  return fmt::format("{} ({} ranks)", mode, world);
}

}  // namespace lmscale::jobs
