// The trainer's state as pieces of named parameters (include/lmscale/jobs/trainer_state.h).
#include "lmscale/jobs/trainer_state.h"

#include <algorithm>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/parallel/fsdp.h"
#include "lmscale/parallel/zero.h"

namespace lmscale::jobs {

namespace {

// One process and DDP: every rank holds all of it; rank r writes the r-th slice of each parameter.
parallel::StateLayout replicated(Trainer& t, int rank, int world) {
  parallel::StateLayout out;
  auto& ps = t.params();
  optim::Optimizer& opt = *t.optimizer();
  for (int i = 0; i < ps.size(); ++i) {
    const auto& p = ps.infos()[static_cast<std::size_t>(i)];
    auto piece = [&](std::int64_t a, std::int64_t b) {
      return parallel::StatePiece{i, a, b, ps.flat_params().flat_range(p.offset + a, b - a),
                                  parallel::state_view(opt, 0, p.offset + a, b - a),
                                  parallel::state_view(opt, 1, p.offset + a, b - a)};
    };
    out.load.push_back(piece(0, p.numel));
    const auto [a, b] = parallel::slice_of(p.numel, rank, world);
    if (a < b) out.save.push_back(piece(a, b));
  }
  return out;
}

// zero1/zero2: the master is replicated (every rank loads all of it), the optimizer state exists for this
// rank's range of the flat buffer only; the range, cut at parameter boundaries, is what it writes.
parallel::StateLayout zero_shard(Trainer& t, parallel::ZeroOptimizer& zero) {
  parallel::StateLayout out;
  auto& ps = t.params();
  const std::int64_t lo = zero.shard_begin(0), hi = lo + zero.shard_size(0);
  optim::Optimizer& opt = zero.group_optimizer(0);
  for (int i = 0; i < ps.size(); ++i) {
    const auto& p = ps.infos()[static_cast<std::size_t>(i)];
    out.load.push_back({i, 0, p.numel, ps.flat_params().flat_range(p.offset, p.numel), Tensor(), Tensor()});
    const std::int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a >= b) continue;
    const Tensor m = parallel::state_view(opt, 0, a - lo, b - a), v = parallel::state_view(opt, 1, a - lo, b - a);
    out.save.push_back({i, a - p.offset, b - p.offset, ps.flat_params().flat_range(a, b - a), m, v});
    out.load.push_back({i, a - p.offset, b - p.offset, Tensor(), m, v});
  }
  return out;
}

parallel::ZeroOptimizer* zero_of(Trainer& t) { return dynamic_cast<parallel::ZeroOptimizer*>(t.sharded()); }

}  // namespace

parallel::StateLayout describe_state(Trainer& t, int rank, int world) {
  if (t.fsdp()) return t.fsdp()->state_layout();
  if (auto* zero = zero_of(t)) return zero_shard(t, *zero);
  LMSCALE_CHECK(t.optimizer() != nullptr, "describe_state: a trainer without an optimizer");
  return replicated(t, rank, world);
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
  const std::string mode = cfg.parallel.zero != "none" ? cfg.parallel.zero
                                                       : "ddp " + (cfg.parallel.ddp == "none" ? "flat" : cfg.parallel.ddp);
  return fmt::format("{} ({} ranks)", mode, world);
}

}  // namespace lmscale::jobs
