// run.job = accounting plans a run rather than running one (include/lmscale/io/deck.h,
// planned_world): its world is accounting.world, or parallel.dp x tp x pp, not the ranks launched.
#include <cstdint>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"

namespace lmscale::io {

int planned_world(const Config& c, int world_size) {
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
