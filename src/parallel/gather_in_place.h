#pragma once
// ZeRO's all-gather of a buffer whose ranks each hold consecutive pieces of it (parallel/zero.cpp,
// parallel/zero_offload.cpp). Internal to the parallel layer.
#include <cstddef>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/tensor.h"

namespace lmscale::parallel {

// All-gathers `buf` in place over `c`: rank q's counts[q] elements, in rank order, with this
// rank's part already at its offset (a shard of the flat buffer, a slice of one, or a packed
// staging slice). Waited unless `async`.
inline comm::Work gather_in_place(comm::Communicator& c, const Tensor& buf, const std::vector<std::size_t>& counts,
                                  bool async = false) {
  std::size_t at = 0;
  for (int q = 0; q < c.rank(); ++q) at += counts[static_cast<std::size_t>(q)];
  const char* mine = static_cast<const char*>(buf.data()) + at * dtype_size(buf.dtype());
  comm::CallOptions o;
  o.async = async;
  return c.all_gather_v(mine, buf.data(), counts, buf.dtype(), o);
}

}  // namespace lmscale::parallel
