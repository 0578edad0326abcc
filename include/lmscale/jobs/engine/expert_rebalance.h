#pragma once
// parallel.ep_rebalance_every = N (docs/moe.md, "Rebalancing the ep ranks"): after every N-th
// training step, each MoE block's experts are relabelled so that the ep ranks' rows even out
// (parallel/expert_placement.h, from the rows of that step's record), and each expert's state
// moves with it: its slices of the stacked w1, w3, w2 and its router row, as fp32 master weights
// and optimizer state (AdamW's m and v), whatever the layout holds of them (parallel/state_layout.h:
// ep slices, zero1/zero2 shards, fsdp units). The model's function does not change: an expert's
// router score moves with its weights (only top-k's tie-break by the lower label can pick another of
// two exactly equal scores). The gradients are not moved: the next step overwrites them.
//
// The move goes through the host: per moved parameter every rank gathers the whole parameter's
// state ([3, numel] fp32 on the host, from the pieces each rank writes to checkpoints), then fills
// what it holds in the new labels. Seconds per call on a 1B model; nothing stays allocated.
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

namespace lmscale::jobs {

class ExpertRebalancer {
 public:
  // every = parallel.ep_rebalance_every (0: never; then nothing is recorded either).
  ExpertRebalancer(JobEnv& env, Trainer& trainer, std::int64_t every, const std::string& table);
  bool due(std::int64_t step) const { return every_ > 0 && step > 0 && step % every_ == 0; }
  // Collective over the world. rows[b][e]: the rows expert label e of the b-th MoE block computed
  // (summed over the world: MoeRecorder::last_rows()). Prints a line on rank 0.
  void rebalance(std::int64_t step, const std::vector<std::vector<double>>& rows);

 private:
  // Relabels full parameter `param` (index in model::parameter_layout) in place on every rank:
  // block i of `block` elements takes old block order[i].
  void relabel(int param, std::int64_t block, const std::vector<int>& order);

  JobEnv& env_;
  Trainer& trainer_;
  std::int64_t every_;
  std::optional<io::Table> table_;
  std::vector<std::vector<int>> origin_;   // [MoE block][label]: that expert's label at the start
};

}  // namespace lmscale::jobs
