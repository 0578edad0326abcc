#include "lmscale/parallel/unit_waits.h"

#include <algorithm>

namespace lmscale::parallel {

std::vector<UnitSegment> unit_segments(const std::vector<model::ParamInfo>& infos, int layers,
                                       const std::vector<GradBucket>& buckets) {
  std::vector<UnitSegment> out;
  for (const auto& k : buckets) {
    int first = layers + 1;
    for (int i = k.first; i <= k.last; ++i) {
      const auto& p = infos[static_cast<std::size_t>(i)];
      const int u = p.layer >= 0 ? p.layer + 1 : (p.kind == model::ParamInfo::Kind::embedding ? 0 : layers + 1);
      first = std::min(first, u);
    }
    out.push_back({k, first});
  }
  return out;
}

void UnitWaits::wait_until(int unit) {
  while (next_ < pending_.size() && pending_[next_].first_unit <= unit) {
    Pending& p = pending_[next_++];
    if (p.wait)
      p.wait();
    else if (p.gathered.valid())
      p.gathered.wait();
    else
      rt_.wait(rt_.ctx(), p.done);
    if (p.bucket >= 0 && released_) released_(p.bucket);
  }
  if (next_ == pending_.size()) {
    pending_.clear();
    next_ = 0;
  }
}

model::ParallelContext UnitWaits::in_front_of(model::ParallelContext pc) {
  if (pending_.empty()) return pc;
  pc.before_forward = [this, inner = std::move(pc.before_forward)](int u) {
    wait_until(u);
    if (inner) inner(u);
  };
  return pc;
}

}  // namespace lmscale::parallel
