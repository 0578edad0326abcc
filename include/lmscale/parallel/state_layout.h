#pragma once
// What of the training state this rank holds, in one form every layout can give (docs/checkpoints.md
// "Ownership"): a list of pieces, each a range of elements of one named parameter with views of
// where those elements live on this rank (fp32 master weights and AdamW m, v). Sharded
// checkpoints (jobs/engine/sharded_checkpointing.h) are written and read through it alone, so any
// layout resumes any other's checkpoint by name.
//
// Coordinates are the FULL model's: `param` indexes model::parameter_layout(dims) (docs/architecture.md §2
// order), [begin, end) is a range of the full parameter's row-major flat index, whatever slice or
// stage of the model this rank's store holds.
//
//   save  pieces this rank writes. Over all ranks they cover every element of every parameter
//         exactly once (replicated state is split among the ranks that hold it, so all ranks
//         write in parallel). Each has master, m and v.
//   load  pieces this rank fills on resume: everything it holds, replicas included. A view may be
//         empty (Tensor(), not defined()) where the rank holds that part of the state for no element of the range (e.g.
//         zero1/zero2 hold the whole master but m, v only for their shard: two kinds of pieces).
//
// Layouts (parallel/replicated_strategy.cpp, zero_strategy.cpp, fsdp.cpp): one process / DDP own everything (save: a
// 1/N slice of each parameter per rank); zero1/zero2 own near-equal ranges of the flat buffer
// (save = load = that range cut at parameter boundaries, plus the replicated master); fsdp owns
// per-unit padded shards (padding is not state) and replicated norms. Tensor parallelism: each
// stored slice is described by full_segments (a column-parallel or vocab-parallel slice = one
// range of rows = one contiguous piece; a row-parallel slice = a block of columns = one piece per
// row); its dp replicas split it for writing, the norms (replicated over tp too) are split over dp
// x tp. Pipeline parallelism: a stage's store holds whole parameters of its layers (global
// indices through ParameterStore::global_index), split for writing among the stage's dp replicas.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "lmscale/core/tensor.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/optim/optimizer.h"

namespace lmscale::parallel {

// m and v are the optimizer's state tensors 0 and 1 (optim/optimizer.h): AdamW's and LAMB's
// moments, SGD's and LARS's momentum buffer in m with no v (empty: nothing is held, and a save
// piece writes zeros there so every rank file keeps its three arrays).
struct StatePiece {
  int param = 0;                     // index in model::parameter_layout(dims) (the full model)
  std::int64_t begin = 0, end = 0;   // element range within the full parameter (row-major flat index)
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

// A run of `count` elements that are contiguous both in the store's parameter (from `local`) and
// in the full parameter's row-major flat index (from `full`).
struct Segment {
  std::int64_t local = 0, full = 0, count = 0;
};

// Where a stored parameter's elements (this rank's tensor-parallel slice, or the whole parameter)
// sit in the full parameter, in local order:
//   whole (split_dim -1)                          one run
//   rows [b, b + R) of [R_full, C] (split_dim 0)  one run: elements [b C, (b + R) C) (C = the
//                                                 product of the other dims: an expert-parallel
//                                                 slice [El, F, d] of a stacked [E, F, d] has C = F d)
//   columns [b, b + C) of [R, C_full] (dim 1)     one run per row i: [i C_full + b, ... + C)
inline std::vector<Segment> full_segments(const model::ParamInfo& p) {
  if (p.split_dim < 0 || p.full_shape.empty()) return {{0, 0, p.numel}};
  const std::int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
  if (p.split_dim == 0) return {{0, p.split_begin * (rows > 0 ? p.numel / rows : 0), p.numel}};
  const std::int64_t full_cols = p.full_shape[1];
  std::vector<Segment> out;
  out.reserve(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) out.push_back({i * cols, i * full_cols + p.split_begin, cols});
  return out;
}

// Appends the pieces of local elements [lo, hi) of a stored parameter `p` (a tensor-parallel slice
// or a whole parameter; `global` = its index in the full model) in full-model coordinates, one
// per contiguous run (full_segments). master, m, v: views of local elements [lo, hi), or empty.
inline void append_full_pieces(std::vector<StatePiece>& out, const model::ParamInfo& p, int global, std::int64_t lo,
                               std::int64_t hi, const Tensor& master, const Tensor& m, const Tensor& v) {
  if (lo >= hi) return;
  auto part = [&](const Tensor& t, std::int64_t a, std::int64_t n) { return t.defined() ? t.flat_range(a - lo, n) : Tensor(); };
  for (const auto& s : full_segments(p)) {
    const std::int64_t a = std::max(lo, s.local), b = std::min(hi, s.local + s.count);
    if (a >= b) continue;
    const std::int64_t full = s.full + (a - s.local);
    out.push_back({global, full, full + (b - a), part(master, a, b - a), part(m, a, b - a), part(v, a, b - a)});
  }
}

}  // namespace lmscale::parallel
