#include "lmscale/parallel/store_offload.h"

#include <algorithm>

#include "lmscale/core/error.h"

namespace lmscale::parallel {

int forward_unit(const model::ParamInfo& p, int layers) {
  if (p.layer >= 0) return p.layer + 1;
  return p.kind == model::ParamInfo::Kind::embedding ? 0 : layers + 1;
}

std::vector<OffloadedShards::Range> store_units(const model::ParameterStore& store, int layers, std::int64_t begin,
                                                std::int64_t end) {
  std::vector<OffloadedShards::Range> units(static_cast<std::size_t>(layers + 2));
  std::vector<bool> seen(units.size(), false);
  int last = -1;
  for (const model::ParamInfo& p : store.infos()) {
    const int u = forward_unit(p, layers);
    LMSCALE_CHECK(u >= last, "offload: parameter {} of unit {} after unit {} (the flat layout holds units in "
                             "forward order)", p.name, u, last);
    last = u;
    const std::int64_t a = std::max(begin, p.offset), b = std::min(end, p.offset + p.numel);
    if (a >= b) continue;
    auto& r = units[static_cast<std::size_t>(u)];
    if (!seen[static_cast<std::size_t>(u)]) r.offset = a - begin;
    seen[static_cast<std::size_t>(u)] = true;
    LMSCALE_CHECK(r.offset + r.count == a - begin, "offload: unit {} is not contiguous in the flat layout", u);
    r.count += b - a;
  }
  // Empty units sit where the next unit starts (their position does not matter, only their count).
  std::int64_t at = end - begin;
  for (std::size_t u = units.size(); u-- > 0;) {
    if (!seen[u]) units[u].offset = at;
    at = units[u].offset;
  }
  return units;
}

std::vector<OffloadedShards::Target> store_targets(model::ParameterStore& store, std::int64_t begin, std::int64_t end) {
  std::vector<OffloadedShards::Target> out;
  const auto reads = store.master_read_ranges();   // offset order; empty without a working copy
  std::int64_t a = begin;
  bool last_master = false;
  auto push = [&](std::int64_t lo, std::int64_t hi, bool master) {
    if (lo >= hi) return;
    // The master's fp32 weights: the store's master_view (its whole master, or the packed
    // master-read ranges, where adjacent ranges stay adjacent).
    auto dst = [&](std::int64_t from, std::int64_t n) {
      return master ? store.master_view(from, n) : store.flat_lowp().flat_range(from, n);
    };
    // fp32 weights under a working copy: their working-copy entries are refreshed too (the
    // working copy is the cast of the master everywhere, as without offload).
    const bool also = master && store.has_lowp();
    if (!out.empty() && last_master == master && out.back().offset + out.back().count == lo - begin) {
      out.back().count += hi - lo;   // the same buffer, contiguous
      out.back().dst = dst(begin + out.back().offset, out.back().count);
      if (also) out.back().also = store.flat_lowp().flat_range(begin + out.back().offset, out.back().count);
      return;
    }
    out.push_back({lo - begin, hi - lo, dst(lo, hi - lo), also ? store.flat_lowp().flat_range(lo, hi - lo) : Tensor()});
    last_master = master;
  };
  for (const auto& [offset, numel] : reads) {
    const std::int64_t lo = std::max(begin, offset), hi = std::min(end, offset + numel);
    if (lo >= hi) continue;
    push(a, lo, !store.has_lowp());
    push(lo, hi, true);
    a = hi;
  }
  push(a, end, !store.has_lowp());
  return out;
}

}  // namespace lmscale::parallel
