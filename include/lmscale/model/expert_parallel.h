#pragma once
// Expert parallelism as the model sees it (docs/moe.md, docs/parallel.md): the E experts of every
// MoE block are split over the ep ranks of an expert-parallel group inside the data-parallel
// group (DeepSpeed-MoE, Megatron-LM). Two parts, neither of which knows about communicators:
//
// 1. ExpertSplit, static: the degree ep and this rank's index. The parameter store derives the
//    local slice of every stacked expert tensor from it: experts [rank E/ep, (rank+1) E/ep), rows
//    of the leading expert axis (split_dim 0, like a column-parallel weight's rows).
// 2. ExpertParallelComm, callbacks over the ep group (set by the parallel layer into
//    ParallelContext::ep): the dispatch and the combine are all-to-alls, counts first, then the
//    rows. Empty callbacks (one process, ep = 1): the model computes every expert itself.
#include <cstdint>
#include <functional>
#include <vector>

#include "lmscale/core/tensor.h"

namespace lmscale::model {

struct ExpertSplit {
  int degree = 1;   // ep
  int rank = 0;     // index in the ep group, 0 .. degree-1

  bool active() const { return degree > 1; }
  std::int64_t local(std::int64_t experts) const { return experts / degree; }
  std::int64_t begin(std::int64_t experts) const { return rank * (experts / degree); }
};

struct ExpertParallelComm {
  // All-to-all of counts over the ep group: send holds ep blocks of `per` counts, block r going to
  // rank r; recv (resized to ep * per) gets block r from rank r.
  std::function<void(const std::vector<std::int64_t>& send, std::int64_t per, std::vector<std::int64_t>& recv)> counts;
  // All-to-all of rows: send [sum send_rows, d] is ep consecutive parts, send_rows[r] rows going
  // to rank r; recv [sum recv_rows, d] receives recv_rows[r] rows from rank r, in rank order.
  // Any float dtype; send and recv on the model's device.
  std::function<void(const Tensor& send, const std::vector<std::int64_t>& send_rows, Tensor& recv,
                     const std::vector<std::int64_t>& recv_rows)>
      rows;

  bool active() const { return static_cast<bool>(rows); }
};

}  // namespace lmscale::model
