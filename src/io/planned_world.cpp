// run.job = accounting plans a run rather than running one (include/lmscale/io/deck.h,
// planned_world): its world is accounting.world, or parallel.dp x tp x pp, not the ranks launched.
#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"

namespace lmscale::io {

namespace {

// run.job = plan: plan.gpus, or the deck's dp x tp x pp (parallel.dp = 0 counting as 1).
int plan_gpus(const Config& c) {
  const auto& p = c.parallel;
  const std::int64_t tp_pp = p.tp * p.pp, gpus = c.plan.gpus;
  if (gpus == 0) return static_cast<int>(std::max<std::int64_t>(1, p.dp) * tp_pp);
  if (gpus % tp_pp != 0)
    throw UsageError(fmt::format("plan.gpus = {} is not a multiple of parallel.tp * parallel.pp = {} * {} = {}; plan a "
                                 "multiple of {} GPUs",
                                 gpus, p.tp, p.pp, tp_pp, tp_pp));
  if (p.dp > 0 && p.dp * tp_pp != gpus)
    throw UsageError(fmt::format("plan.gpus = {} but parallel.dp * parallel.tp * parallel.pp = {} * {} * {} = {}; set "
                                 "parallel.dp = 0 (auto) or plan.gpus = {}",
                                 gpus, p.dp, p.tp, p.pp, p.dp * tp_pp, p.dp * tp_pp));
  constexpr std::int64_t kMostGpus = std::int64_t{1} << 20;
  if (gpus > kMostGpus)
    throw UsageError(fmt::format("plan.gpus = {} is more GPUs than lmscale plans for (at most {})", gpus, kMostGpus));
  return static_cast<int>(gpus);
}

}  // namespace

int planned_world(const Config& c, int world_size) {
  if (c.run.job == JobKind::plan) return plan_gpus(c);
  if (c.run.job != JobKind::accounting) return world_size;
  const auto& p = c.parallel;
  const auto& a = c.accounting;
  const std::int64_t tp_pp = p.tp * p.pp;
  if (a.world == 0) return p.dp > 0 ? static_cast<int>(p.dp * tp_pp) : world_size;
  if (a.world % tp_pp != 0)
    throw UsageError(fmt::format("accounting.world = {} is not a multiple of parallel.tp * parallel.pp = {} * {} = {}; "
                                 "plan a multiple of {} ranks",
                                 a.world, p.tp, p.pp, tp_pp, tp_pp));
  if (p.dp > 0 && p.dp * tp_pp != a.world)
    throw UsageError(fmt::format("accounting.world = {} but parallel.dp * parallel.tp * parallel.pp = {} * {} * {} = {}; "
                                 "set parallel.dp = 0 (auto) or accounting.world = {}",
                                 a.world, p.dp, p.tp, p.pp, p.dp * tp_pp, p.dp * tp_pp));
  constexpr std::int64_t kMostRanks = std::int64_t{1} << 24;   // an int, and far beyond any machine
  if (a.world > kMostRanks)
    throw UsageError(fmt::format("accounting.world = {} is more ranks than lmscale plans for (at most {}); plan fewer "
                                 "ranks",
                                 a.world, kMostRanks));
  return static_cast<int>(a.world);
}

}  // namespace lmscale::io
