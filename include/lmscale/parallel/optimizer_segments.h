#pragma once
// Which parameter each element of an optimizer's state range belongs to (optim/optimizer.h), for
// the layouts that hold a contiguous range of a store's flat buffer: the whole buffer (one
// process, DDP, a pipeline stage, a tensor-parallel rank's slices) or a ZeRO shard. RMSNorm gains
// are not layer-wise (LARS/LAMB exclude them from the trust ratio and the weight decay).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "lmscale/model/parameter_store.h"
#include "lmscale/optim/optimizer.h"

namespace lmscale::parallel {

// Segments of the parameters overlapping flat elements [lo, hi), offsets relative to lo; the
// parameter index is the store's.
inline std::vector<optim::ParamSegment> param_segments(const std::vector<model::ParamInfo>& infos, std::int64_t lo,
                                                       std::int64_t hi) {
  std::vector<optim::ParamSegment> out;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& p = infos[i];
    const std::int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a < b) out.push_back({a - lo, b - a, static_cast<int>(i), p.kind != model::ParamInfo::Kind::norm});
  }
  return out;
}

}  // namespace lmscale::parallel
