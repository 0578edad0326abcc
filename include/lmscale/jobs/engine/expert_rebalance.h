#pragma once
// parallel.ep_rebalance_every = N (docs/moe.md, "Rebalancing the ep ranks"): after every N-th
// training step, each MoE block's experts are relabelled so that the ep ranks' rows even out
// (parallel/expert_placement.h, from the rows routed since the previous record: the last logged step
// or relabelling; every step in bench-model), and each expert's state
// moves with it: its slices of the stacked w1, w3, w2 and its router row, as fp32 master weights
// and optimizer state (AdamW's m and v), whatever the layout holds of them (parallel/state_layout.h:
// ep slices, zero1/zero2 shards, fsdp units). The model's function does not change: an expert's
// router score moves with its weights (only top-k's tie-break by the lower label can pick another of
// two exactly equal scores). The gradients are not moved: the next step overwrites them.
//
// The move, per relabelled parameter: every rank tells the others (over the host communicator)
// which ranges it writes to checkpoints (its save pieces: each element once over the world) and
// which it holds (its load pieces); from these every rank derives the same plan, and only the
// elements of relabelled blocks cross, from their writer to each holder, in one all-to-all over
// the device communicator (NCCL on GPUs), packed and unpacked on the device. The buffers (tag
// "ep_rebalance") hold one parameter's moved state at a time and are freed before the next step.
//
// Records a row per MoE block and rebalance in `table` (/train/ep_placement or
// /bench_model/ep_placement): the step, the busiest ep rank's rows over the mean rank's under the
// old and the new labels, the experts moved, the seconds, and origin_e = the label expert e had at
// the start of this run (so a plot can follow an expert across relabellings).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/jobs/job_env.h"
#include "lmscale/parallel/state_layout.h"

namespace lmscale::jobs {

class ExpertRebalancer {
 public:
  // A piece of a full parameter's flat index: parameter, elements [begin, end).
  struct PieceRange {
    int param = 0;
    std::int64_t begin = 0, end = 0;
  };
  using RankPieces = std::vector<std::vector<PieceRange>>;   // [rank][piece], in each rank's order
  // every = parallel.ep_rebalance_every (0: never; then nothing is recorded either).
  ExpertRebalancer(JobEnv& env, Trainer& trainer, std::int64_t every, const std::string& table);
  bool due(std::int64_t step) const { return every_ > 0 && step > 0 && step % every_ == 0; }
  // Collective over the world. rows[b][e]: the rows expert label e of the b-th MoE block computed
  // (summed over the world: MoeRecorder::last_rows()). Prints a line on rank 0.
  void rebalance(std::int64_t step, const std::vector<std::vector<double>>& rows);

 private:
  // Relabels full parameter `param` (index in model::parameter_layout) in place on every rank:
  // block i of `block` elements takes old block order[i]. state: this rank's pieces; saves,
  // loads: every rank's save and load pieces (all three taken once per rebalance, after the
  // optimizer settled: relabelling moves values, not pieces).
  void relabel(const parallel::StateLayout& state, const RankPieces& saves, const RankPieces& loads, int param,
               std::int64_t block, const std::vector<int>& order);

  JobEnv& env_;
  Trainer& trainer_;
  std::int64_t every_;
  std::optional<io::Table> table_;
  std::vector<std::vector<int>> origin_;   // [MoE block][label]: that expert's label at the start
};

}  // namespace lmscale::jobs
