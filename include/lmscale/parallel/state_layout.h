#pragma once
// What of the training state this rank holds, in one form every layout can give (docs/checkpoints.md
// "Ownership"): a list of pieces, each a range of elements of one named parameter with views of
// where those elements live on this rank (fp32 master weights and AdamW m, v). Sharded
// checkpoints (jobs/sharded_checkpointing.h) are written and read through it alone, so any
// layout resumes any other's checkpoint by name.
//
//   save  pieces this rank writes. Over all ranks they cover every element of every parameter
//         exactly once (replicated state is split among the ranks that hold it, so all ranks
//         write in parallel). Each has master, m and v.
//   load  pieces this rank fills on resume: everything it holds, replicas included. A view may be
//         empty (Tensor(), not defined()) where the rank holds that part of the state for no element of the range (e.g.
//         zero1/zero2 hold the whole master but m, v only for their shard: two kinds of pieces).
//
// Layouts: one process / DDP own everything (save: a 1/N slice of each parameter per rank);
// zero1/zero2 own near-equal ranges of the flat buffer (save = load = that range cut at parameter
// boundaries, plus the replicated master); fsdp owns per-unit padded shards (padding is not
// state) and replicated norms. Tensor parallelism would give a column slice (rows [r*d/tp,
// (r+1)*d/tp) of a [d_out, d_in] weight: one piece) or a row slice (one piece per row) per
// parameter; a pipeline stage gives whole parameters of its layers.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "lmscale/core/tensor.h"
#include "lmscale/optim/optimizer.h"

namespace lmscale::parallel {

// m and v are the optimizer's state tensors 0 and 1 (optim/optimizer.h): AdamW's and LAMB's
// moments, SGD's and LARS's momentum buffer in m with no v (empty: nothing is held, and a save
// piece writes zeros there so every rank file keeps its three arrays).
struct StatePiece {
  int param = 0;                     // index in the parameter store's infos()
  std::int64_t begin = 0, end = 0;   // element range within the parameter (row-major flat index)
  Tensor master, m, v;               // fp32 views of end - begin elements each, or empty
};

// View of elements [offset, offset + n) of an optimizer's state k, or an empty tensor when the
// optimizer has fewer states.
inline Tensor state_view(optim::Optimizer& opt, int k, std::int64_t offset, std::int64_t n) {
  return k < opt.num_states() ? opt.state(k).flat_range(offset, n) : Tensor();
}

struct StateLayout {
  std::vector<StatePiece> save;
  std::vector<StatePiece> load;
};

// [begin, end) of the r-th of n near-equal slices of `count` elements (the first count % n get one
// more): how replicated state is split for writing.
inline std::pair<std::int64_t, std::int64_t> slice_of(std::int64_t count, int r, int n) {
  const std::int64_t base = count / n, extra = count % n;
  const std::int64_t begin = r * base + std::min<std::int64_t>(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

}  // namespace lmscale::parallel
